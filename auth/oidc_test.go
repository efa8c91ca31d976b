package auth

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// fakeIssuer is an OpenID Connect issuer serving a discovery document and a key set that
// the test replaces, counting the requests for the key set.
type fakeIssuer struct {
	*httptest.Server
	jwksFetches atomic.Int32
	mu          sync.Mutex
	discovery   map[string]string // nil: the correct one
	jwks        []byte            // nil: 500
}

func newFakeIssuer(t *testing.T, keys ...jwk) *fakeIssuer {
	f := &fakeIssuer{jwks: jwksJSON(keys...)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		doc := f.discovery
		f.mu.Unlock()
		if doc == nil {
			doc = map[string]string{"issuer": f.URL, "jwks_uri": f.URL + "/keys"}
		}
		json.NewEncoder(w).Encode(doc)
	})
	mux.HandleFunc("GET /keys", func(w http.ResponseWriter, r *http.Request) {
		f.jwksFetches.Add(1)
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.jwks == nil {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.Write(f.jwks)
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

func (f *fakeIssuer) serve(jwks []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.jwks = jwks
}

// TestOIDCKeyRotation walks an issuer through a key rotation: a token naming a new kid
// refreshes the key set, but only once per minRefreshInterval however many unknown kids
// arrive, and a failed refresh keeps the keys it had.
func TestOIDCKeyRotation(t *testing.T) {
	tk := testKeys()
	iss := newFakeIssuer(t, rsaJWK("rsa-1", &tk.rsa.PublicKey))
	k, err := New(Config{OIDCIssuer: iss.URL})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now() // not before the first fetch
	c := goodClaims(start)
	c.Issuer = iss.URL // the default expected issuer of an OIDC issuer
	rsa1 := signToken(t, jwt.SigningMethodRS256, "rsa-1", tk.rsa, c)
	ec2 := signToken(t, jwt.SigningMethodES256, "ec-2", tk.ec2, c)
	bogus := func(kid string) string { return signToken(t, jwt.SigningMethodES256, kid, tk.ec2, c) }
	rotated := jwksJSON(ecJWK("ec-2", &tk.ec2.PublicKey))
	c.Subject = "alice-again" // another token by a key rotated out, so not answered from the cache
	rsa1Uncached := signToken(t, jwt.SigningMethodRS256, "rsa-1", tk.rsa, c)
	c.Subject = "alice"
	c.Issuer = defaultIssuer
	wrongIssuer := signToken(t, jwt.SigningMethodRS256, "rsa-1", tk.rsa, c)

	for _, step := range []struct {
		name        string
		after       time.Duration // since start
		jwks        []byte        // served from this step on; nil: unchanged
		down        bool          // the issuer answers 500 from this step on
		token       string
		want        error
		wantFetches int32 // key set fetches so far, the one of New included
	}{
		{"known kid", 0, nil, false, rsa1, nil, 1},
		{"issuer is not the default one", 0, nil, false, wrongIssuer, jwt.ErrTokenInvalidIssuer, 1},
		{"rotated, but fetched too recently", 10 * time.Second, rotated, false, ec2, errUnknownKey, 1},
		{"rotated key learnt", 31 * time.Second, nil, false, ec2, nil, 2},
		{"a rotated-out key is refused", 32 * time.Second, nil, false, rsa1Uncached, errUnknownKey, 2},
		{"bogus kid within the interval", 40 * time.Second, nil, false, bogus("nope-1"), errUnknownKey, 2},
		{"another bogus kid within the interval", 60 * time.Second, nil, false, bogus("nope-2"), errUnknownKey, 2},
		{"bogus kid after the interval", 62 * time.Second, nil, false, bogus("nope-3"), errUnknownKey, 3},
		{"issuer down", 93 * time.Second, nil, true, bogus("nope-4"), errUnknownKey, 4},
		{"issuer down, known keys still work", 94 * time.Second, nil, false, ec2, nil, 4},
		{"issuer down, not asked again", 100 * time.Second, nil, false, bogus("nope-5"), errUnknownKey, 4},
	} {
		if step.jwks != nil {
			iss.serve(step.jwks)
		}
		if step.down {
			iss.serve(nil)
		}
		at(k, start.Add(step.after))
		_, err := k.Verify(step.token)
		if step.want == nil && err != nil || step.want != nil && !errors.Is(err, step.want) {
			t.Errorf("%s: Verify = %v, want %v", step.name, err, step.want)
		}
		if got := iss.jwksFetches.Load(); got != step.wantFetches {
			t.Errorf("%s: %d key set fetches, want %d", step.name, got, step.wantFetches)
		}
	}
}

// TestOIDCConcurrentUnknownKidFetchesOnce: verifiers that meet a new kid together share one
// refresh, and all of them find the new key.
func TestOIDCConcurrentUnknownKidFetchesOnce(t *testing.T) {
	tk := testKeys()
	iss := newFakeIssuer(t, rsaJWK("rsa-1", &tk.rsa.PublicKey))
	k, err := New(Config{OIDCIssuer: iss.URL})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	at(k, now.Add(minRefreshInterval))
	iss.serve(jwksJSON(rsaJWK("rsa-1", &tk.rsa.PublicKey), ecJWK("ec-2", &tk.ec2.PublicKey)))
	c := goodClaims(now)
	c.Issuer = iss.URL
	var wg sync.WaitGroup
	for i := range 20 {
		c.Subject = "user-" + string(rune('a'+i)) // distinct tokens: no answer from the cache
		tok := signToken(t, jwt.SigningMethodES256, "ec-2", tk.ec2, c)
		wg.Go(func() {
			if _, err := k.Verify(tok); err != nil {
				t.Errorf("Verify = %v", err)
			}
		})
	}
	wg.Wait()
	if got := iss.jwksFetches.Load(); got != 2 {
		t.Errorf("%d key set fetches, want 2", got)
	}
}

// TestOIDCIssuerRefusedAtStart: New fails, with the reason, when the issuer cannot be used.
func TestOIDCIssuerRefusedAtStart(t *testing.T) {
	tk := testKeys()
	for _, tt := range []struct {
		name      string
		issuer    func(f *fakeIssuer) string
		discovery func(f *fakeIssuer) map[string]string
		jwks      []byte // nil: a usable one
		down      bool   // the key set answers 500
		wantErr   string
	}{
		{
			name: "discovery names another issuer",
			discovery: func(f *fakeIssuer) map[string]string {
				return map[string]string{"issuer": "https://evil.example", "jwks_uri": f.URL + "/keys"}
			},
			wantErr: `discovery document names issuer "https://evil.example"`,
		},
		{
			name:      "no jwks_uri",
			discovery: func(f *fakeIssuer) map[string]string { return map[string]string{"issuer": f.URL} },
			wantErr:   "jwks_uri",
		},
		{
			name: "jwks_uri over plain http across a network",
			discovery: func(f *fakeIssuer) map[string]string {
				return map[string]string{"issuer": f.URL, "jwks_uri": "http://keys.example/jwks"}
			},
			wantErr: "http://keys.example/jwks is neither https nor http to a loopback address",
		},
		{
			name:    "issuer over plain http across a network",
			issuer:  func(*fakeIssuer) string { return "http://id.example" },
			wantErr: "neither https nor http to a loopback address",
		},
		{
			name:    "no discovery document",
			issuer:  func(f *fakeIssuer) string { return f.URL + "/elsewhere" },
			wantErr: "404",
		},
		{
			name:    "no usable key",
			jwks:    jwksJSON(jwk{"kty": "oct", "k": "c2VjcmV0"}),
			wantErr: `skipped key 0 (kid ""): kty "oct"`,
		},
		{
			name:    "key set down",
			down:    true,
			wantErr: "500",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeIssuer(t, rsaJWK("rsa-1", &tk.rsa.PublicKey))
			if tt.discovery != nil {
				f.discovery = tt.discovery(f)
			}
			if tt.jwks != nil {
				f.jwks = tt.jwks
			}
			if tt.down {
				f.jwks = nil
			}
			issuer := f.URL
			if tt.issuer != nil {
				issuer = tt.issuer(f)
			}
			_, err := New(Config{OIDCIssuer: issuer})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("New = %v, want an error with %q", err, tt.wantErr)
			}
		})
	}
}
