package server

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/auth"
)

// TestUnauthenticatedRequestsAreRefused: every way of not presenting a valid token gets 401,
// code UNAUTHENTICATED and a WWW-Authenticate challenge, on POST and on GET, and no resolver
// runs (the response has no data).
func TestUnauthenticatedRequestsAreRefused(t *testing.T) {
	a := newAPI(t)
	otherKeys, err := auth.NewKeys([]byte("another-secret-another-secret-another"))
	if err != nil {
		t.Fatal(err)
	}
	admin := auth.Principal{Subject: "admin", Grants: []auth.Grant{{OrganizationID: "acme", Role: auth.RoleAdmin}}}
	foreign, err := otherKeys.Mint(admin, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	expired, err := a.keys.Mint(admin, time.Now().Add(-3*time.Hour), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	notYetValid, err := a.keys.Mint(admin, time.Now().Add(time.Hour), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	valid := a.admin(t)
	tampered := valid[:len(valid)-4] + "AAAA"
	if tampered == valid {
		tampered = valid[:len(valid)-4] + "BBBB"
	}

	tests := []struct {
		name          string
		authorization string // the whole header; "" sends none
	}{
		{"no header", ""},
		{"empty bearer", "Bearer "},
		{"bearer without space", "Bearer"},
		{"basic scheme", "Basic YWRtaW46YWRtaW4="},
		{"token without scheme", valid},
		{"garbage token", "Bearer not-a-jwt"},
		{"three garbage segments", "Bearer a.b.c"},
		{"signed with another secret", "Bearer " + foreign},
		{"expired", "Bearer " + expired},
		{"not valid yet", "Bearer " + notYetValid},
		{"tampered signature", "Bearer " + tampered},
		{"alg none", "Bearer " + unsignedToken(`{"sub":"admin","iss":"computeql","aud":"computeql","exp":4102444800,"grants":[{"org":"acme","role":"admin"}]}`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, method := range []string{http.MethodPost, http.MethodGet} {
				var req *http.Request
				if method == http.MethodPost {
					req = httptest.NewRequest(method, "/graphql", strings.NewReader(`{"query":"{ me { subject } }"}`))
					req.Header.Set("Content-Type", "application/json")
				} else {
					req = httptest.NewRequest(method, "/graphql?query=%7B+me+%7B+subject+%7D+%7D", nil)
				}
				if tt.authorization != "" {
					req.Header.Set("Authorization", tt.authorization)
				}
				res := a.send(t, "", req)
				wantError(t, res, http.StatusUnauthorized, "UNAUTHENTICATED")
				if !strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Bearer ") {
					t.Errorf("%s: WWW-Authenticate = %q, want a Bearer challenge", method, res.Header.Get("WWW-Authenticate"))
				}
				if res.Data != nil {
					t.Errorf("%s: an unauthenticated request got data: %s", method, res.Raw)
				}
				if ct := res.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("%s: Content-Type = %q", method, ct)
				}
			}
		})
	}
}

// unsignedToken is a JWT with "alg":"none" and no signature, carrying the claims.
func unsignedToken(claims string) string {
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + enc.EncodeToString([]byte(claims)) + "."
}

// TestInvalidTokenChallengeSaysInvalidToken: a presented but rejected token is told apart from
// a missing one, as RFC 6750 §3.1 asks.
func TestInvalidTokenChallengeSaysInvalidToken(t *testing.T) {
	a := newAPI(t)
	missing := a.post(t, "", `{ me { subject } }`, nil)
	if got := missing.Header.Get("WWW-Authenticate"); strings.Contains(got, "invalid_token") {
		t.Errorf("missing token challenge = %q, must not claim invalid_token", got)
	}
	bad := a.post(t, "garbage", `{ me { subject } }`, nil)
	if got := bad.Header.Get("WWW-Authenticate"); !strings.Contains(got, `error="invalid_token"`) {
		t.Errorf("bad token challenge = %q, want error=\"invalid_token\"", got)
	}
}

// TestMeReturnsExactlyTheTokensGrants: me echoes the subject and every grant, with projectId
// null for organization-wide grants and roles as upper-case enum values.
func TestMeReturnsExactlyTheTokensGrants(t *testing.T) {
	a := newAPI(t)
	tok := a.token(t, "alice@example.com",
		auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleMember},
		auth.Grant{OrganizationID: "acme", Role: auth.RoleViewer},
		auth.Grant{OrganizationID: "globex", ProjectID: "staging", Role: auth.RoleOperator},
		auth.Grant{OrganizationID: "globex", Role: auth.RoleAdmin},
	)
	res := a.mustPost(t, tok, `{ me { subject grants { organizationId projectId role } } }`, nil)
	type grant struct {
		OrganizationID string  `json:"organizationId"`
		ProjectID      *string `json:"projectId"`
		Role           string  `json:"role"`
	}
	var me struct {
		Subject string  `json:"subject"`
		Grants  []grant `json:"grants"`
	}
	decode(t, res.Data["me"], &me)
	web, staging := "web", "staging"
	want := []grant{
		{"acme", &web, "MEMBER"},
		{"acme", nil, "VIEWER"},
		{"globex", &staging, "OPERATOR"},
		{"globex", nil, "ADMIN"},
	}
	if me.Subject != "alice@example.com" {
		t.Errorf("subject = %q", me.Subject)
	}
	if !reflect.DeepEqual(me.Grants, want) {
		t.Errorf("grants = %s, want the token's four grants in order", res.Raw)
	}
	// projectId must be JSON null, not "" or absent.
	if !strings.Contains(string(res.Raw), `"projectId":null`) {
		t.Errorf("organization-wide grant's projectId is not null: %s", res.Raw)
	}
}

// TestTokenWithoutGrantsSeesNothing: a valid token without grants authenticates, but every
// organization is unknown to it.
func TestTokenWithoutGrantsSeesNothing(t *testing.T) {
	a := newAPI(t)
	tok := a.token(t, "nobody")
	res := a.mustPost(t, tok, `{ me { subject grants { role } } networks { id } }`, nil)
	var out struct {
		Me struct {
			Grants []any `json:"grants"`
		} `json:"me"`
		Networks []any `json:"networks"`
	}
	decode(t, res.Data, &out)
	if len(out.Me.Grants) != 0 || len(out.Networks) != 0 {
		t.Errorf("token without grants sees %s", res.Raw)
	}
	wantError(t, a.post(t, tok, `{ quota(organizationId: "acme") { organizationId } }`, nil), http.StatusOK, "NOT_FOUND")
}

// TestBearerSchemeIsCaseInsensitive: RFC 7235 auth schemes ignore case.
func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		req := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(`{"query":"{ me { subject } }"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", scheme+" "+tok)
		rec := httptest.NewRecorder()
		a.handler.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"subject":"admin"`) {
			t.Errorf("%s: %d %s", scheme, rec.Code, rec.Body.String())
		}
	}
}
