package app

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCatalogImportRefusals: what catalog import refuses before it calls any cloud, each
// with a message saying what to give. Its listing of a real cloud is tested end to end in
// e2e/openstack.
func TestCatalogImportRefusals(t *testing.T) {
	clouds := filepath.Join(t.TempDir(), "clouds.yaml")
	if err := os.WriteFile(clouds, []byte("clouds:\n  other:\n    auth:\n      auth_url: http://127.0.0.1:1/v3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"catalog"}, "needs a subcommand: import"},
		{[]string{"catalog", "export"}, "needs a subcommand: import"},
		{[]string{"catalog", "import"}, "needs --cloud"},
		{[]string{"catalog", "import", "--cloud", "prod", "extra"}, "unexpected arguments"},
		{[]string{"catalog", "import", "--cloud", "prod", "--clouds-file", clouds}, `cloud "prod"`},
	} {
		err := Run(context.Background(), tc.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("computeql %s: %v, want an error saying %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
	var out bytes.Buffer
	if err := Run(context.Background(), []string{"help", "catalog"}, &out); err != nil || !strings.Contains(out.String(), "catalog import --cloud NAME") {
		t.Errorf("computeql help catalog: %v, %q", err, out.String())
	}
}
