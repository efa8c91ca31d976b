package auth

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func mustKeys(t *testing.T, s []byte) *Keys {
	t.Helper()
	k, err := NewKeys(s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestRoleIn(t *testing.T) {
	p := Principal{Subject: "s", Grants: []Grant{
		{OrganizationID: "acme", ProjectID: "web", Role: RoleMember},
		{OrganizationID: "acme", Role: RoleViewer},
		{OrganizationID: "globex", Role: RoleAdmin},
	}}
	tests := []struct {
		org, project string
		want         Role
	}{
		{"acme", "web", RoleMember},   // project grant beats the weaker org grant
		{"acme", "data", RoleViewer},  // org grant covers every project
		{"acme", "", RoleViewer},      // only org-wide grants count without a project
		{"globex", "prod", RoleAdmin}, // admin is org-wide
		{"initech", "x", ""},          // no grant
		{"acme-web", "", ""},          // no prefix matching
	}
	for _, tt := range tests {
		if got := p.RoleIn(tt.org, tt.project); got != tt.want {
			t.Errorf("RoleIn(%q, %q) = %q, want %q", tt.org, tt.project, got, tt.want)
		}
	}
	if !p.Allows("acme", "web", RoleOperator) || p.Allows("acme", "data", RoleOperator) {
		t.Error("Allows does not follow the role order")
	}
	if !p.SeesOrganization("globex") || p.SeesOrganization("initech") {
		t.Error("SeesOrganization wrong")
	}
	if got := p.Organizations(); strings.Join(got, ",") != "acme,globex" {
		t.Errorf("Organizations = %v", got)
	}
}

func TestRoleOrder(t *testing.T) {
	order := []Role{RoleViewer, RoleOperator, RoleMember, RoleAdmin}
	for i, r := range order {
		for j, min := range order {
			if got := r.Includes(min); got != (i >= j) {
				t.Errorf("%s.Includes(%s) = %v", r, min, got)
			}
		}
	}
	if Role("").Includes(RoleViewer) || RoleAdmin.Includes("") {
		t.Error("the empty role must include nothing and be included by nothing")
	}
	if r, err := ParseRole("OPERATOR"); err != nil || r != RoleOperator {
		t.Errorf("ParseRole(OPERATOR) = %q, %v", r, err)
	}
	if _, err := ParseRole("root"); err == nil {
		t.Error("ParseRole(root) accepted")
	}
}

func TestTokenRoundTrip(t *testing.T) {
	k := mustKeys(t, secret)
	p := Principal{Subject: "alice", Grants: []Grant{{OrganizationID: "acme", ProjectID: "web", Role: RoleMember}}}
	tok, err := k.Mint(p, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got, err := k.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if got.Subject != "alice" || len(got.Grants) != 1 || got.Grants[0] != p.Grants[0] {
		t.Errorf("verified %+v", got)
	}
}

func TestMintNeedsASecret(t *testing.T) {
	k, err := New(Config{JWKSFile: writeJWKS(t, rsaJWK("rsa-1", &testKeys().rsa.PublicKey))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Mint(Principal{Subject: "s"}, time.Now(), time.Hour); !errors.Is(err, ErrNoSecret) {
		t.Errorf("Mint without a secret = %v, want ErrNoSecret", err)
	}
}

func TestNewKeysNeedsALongSecret(t *testing.T) {
	if _, err := NewKeys([]byte("short")); err == nil {
		t.Error("short secret accepted")
	}
	if len(RandomSecret()) < MinSecretBytes {
		t.Error("random secret too short")
	}
}

func TestMintRefusesBadGrants(t *testing.T) {
	k := mustKeys(t, secret)
	for name, p := range map[string]Principal{
		"no subject":    {Grants: []Grant{{OrganizationID: "acme", Role: RoleViewer}}},
		"long subject":  {Subject: strings.Repeat("s", MaxSubjectBytes+1), Grants: []Grant{{OrganizationID: "acme", Role: RoleViewer}}},
		"project admin": {Subject: "s", Grants: []Grant{{OrganizationID: "acme", ProjectID: "web", Role: RoleAdmin}}},
		"no org":        {Subject: "s", Grants: []Grant{{Role: RoleViewer}}},
	} {
		if _, err := k.Mint(p, time.Now(), time.Hour); err == nil {
			t.Errorf("%s: minted", name)
		}
	}
}

// TestVerifiedTokensAreCachedOnlyUntilTheyExpire: a token verified once is answered from the
// cache, but the cache never outlives the token's own expiry.
func TestVerifiedTokensAreCachedOnlyUntilTheyExpire(t *testing.T) {
	k := mustKeys(t, secret)
	now := time.Now()
	k.now = func() time.Time { return now }
	tok, err := k.Mint(Principal{Subject: "alice", Grants: []Grant{{OrganizationID: "acme", Role: RoleViewer}}}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Verify(tok); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.verified.Get(tok); !ok {
		t.Fatal("a verified token is not cached")
	}
	now = now.Add(time.Hour + defaultClockSkew - time.Second)
	if _, err := k.Verify(tok); err != nil {
		t.Errorf("within the skew after expiry: %v", err)
	}
	now = now.Add(2 * time.Second)
	if _, err := k.Verify(tok); !errors.Is(err, ErrInvalidToken) {
		t.Errorf("expired cached token: %v, want ErrInvalidToken", err)
	}
	if _, ok := k.verified.Get(tok); ok {
		t.Error("an expired token stays cached")
	}
	// A refused token is never cached.
	if _, err := k.Verify(tamper(tok)); err == nil {
		t.Fatal("tampered token accepted")
	}
	if k.verified.Contains(tamper(tok)) {
		t.Error("a refused token is cached")
	}
}
