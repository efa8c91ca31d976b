package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/e2e/harness"
)

// The processes run under callgrind and the counts are of the counted requests: each process
// counted some, a create costs the API more than a ping costs the bare handler, and the
// report says so.
func TestInstructions(t *testing.T) {
	cfg, err := parseConfig([]string{"--instructions", "20"}, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.exe = harness.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	in, err := countInstructions(ctx, cfg, cfg.Instructions)
	if err != nil {
		t.Fatal(err)
	}
	if in.Requests != 20 || in.API == 0 || in.Redis == 0 || in.Bare == 0 || in.API <= in.Bare {
		t.Errorf("counted %+v: want every process's count, a create above a ping", in)
	}
	var out bytes.Buffer
	if err := writeInstructions(&out, in); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"20 requests", "createInstance", "bare gqlgen { ping }", "create ÷ bare"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestCallgrindTotal(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, dump string
		want       uint64
		fails      bool
	}{
		{"summary", "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 703899595\n\nfn=(1) main\n", 703899595, false},
		{"no summary", "version: 1\nevents: Ir\n", 0, true},
		{"not a number", "summary: many\n", 0, true},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
		if err := os.WriteFile(path, []byte(c.dump), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := callgrindTotal(path)
		if got != c.want || (err != nil) != c.fails {
			t.Errorf("%s: %d, %v; want %d, failing %v", c.name, got, err, c.want, c.fails)
		}
	}
	if _, err := callgrindTotal(filepath.Join(dir, "none")); err == nil {
		t.Error("a missing dump: no error")
	}
}
