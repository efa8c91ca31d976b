package app

import (
	"bytes"
	"context"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"github.com/computeql/computeql/auth"
)

const grantSecret = "grant-test-secret-grant-test-secret"

// TestTokenGrantsAndIssuer: --grant adds grants after the --org one, and the token carries
// the issuer and audience a server given the same flags expects.
func TestTokenGrantsAndIssuer(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), []string{"token", "--token-secret", grantSecret, "--subject", "ci",
		"--org", "acme", "--role", "member", "--grant", "globex=admin", "--grant", "initech/db=Viewer",
		"--token-issuer", "https://id.example", "--token-audience", "api"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	tok := strings.TrimSpace(out.String())
	keys, err := auth.New(auth.Config{Secret: []byte(grantSecret), Issuer: "https://id.example", Audience: "api"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := keys.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	want := []auth.Grant{
		{OrganizationID: "acme", Role: auth.RoleMember},
		{OrganizationID: "globex", Role: auth.RoleAdmin},
		{OrganizationID: "initech", ProjectID: "db", Role: auth.RoleViewer},
	}
	if p.Subject != "ci" || !reflect.DeepEqual(p.Grants, want) {
		t.Errorf("principal = %+v", p)
	}
	defaults, _ := auth.NewKeys([]byte(grantSecret))
	if _, err := defaults.Verify(tok); !errors.Is(err, jwt.ErrTokenInvalidIssuer) {
		t.Errorf("verified by a server with the default issuer: %v", err)
	}
}

func TestTokenRefusesBadGrants(t *testing.T) {
	base := []string{"token", "--token-secret", grantSecret, "--subject", "s"}
	for name, args := range map[string][]string{
		"no grant":            {},
		"grant without role":  {"--grant", "acme"},
		"grant without org":   {"--grant", "/web=viewer"},
		"grant unknown role":  {"--grant", "acme=root"},
		"grant project admin": {"--grant", "acme/web=admin"},
		"project without org": {"--grant", "acme=viewer", "--project", "web"},
		"role without org":    {"--grant", "acme=viewer", "--role", "admin"},
	} {
		if err := Run(context.Background(), append(base[:len(base):len(base)], args...), io.Discard); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
