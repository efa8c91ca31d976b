package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// keyPairs are the private keys the tests sign with. "other" keys are published under the
// same kid as their namesake to forge a signature; they are never in a key set.
type keyPairs struct {
	rsa, rsaOther, rsa2 *rsa.PrivateKey
	ec, ecOther, ec2    *ecdsa.PrivateKey
}

// testKeys generates the keys once: RSA generation is slow under -race.
var testKeys = sync.OnceValue(func() keyPairs {
	genRSA := func() *rsa.PrivateKey {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			panic(err)
		}
		return k
	}
	genEC := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		return k
	}
	return keyPairs{rsa: genRSA(), rsaOther: genRSA(), rsa2: genRSA(), ec: genEC(), ecOther: genEC(), ec2: genEC()}
})

// jwk is one member of a test key set, as JSON.
type jwk map[string]string

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func rsaJWK(kid string, pub *rsa.PublicKey) jwk {
	return jwk{"kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig", "n": b64(pub.N.Bytes()), "e": b64(big.NewInt(int64(pub.E)).Bytes())}
}

func ecJWK(kid string, pub *ecdsa.PublicKey) jwk {
	b, err := pub.Bytes()
	if err != nil {
		panic(err)
	}
	return jwk{"kty": "EC", "kid": kid, "crv": "P-256", "x": b64(b[1:33]), "y": b64(b[33:])}
}

func jwksJSON(keys ...jwk) []byte {
	b, err := json.Marshal(map[string][]jwk{"keys": keys})
	if err != nil {
		panic(err)
	}
	return b
}

// writeJWKS writes a key set file into the test's temporary directory.
func writeJWKS(t *testing.T, keys ...jwk) string {
	t.Helper()
	return writeFile(t, jwksJSON(keys...))
}

func writeFile(t *testing.T, data []byte) string {
	t.Helper()
	name := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}

// at fixes the keys' clock.
func at(k *Keys, now time.Time) { k.now = func() time.Time { return now } }

// signToken signs claims with alg and key, naming kid in the header unless it is empty.
func signToken(t *testing.T, method jwt.SigningMethod, kid string, key any, c jwt.Claims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// hs256 signs with HMAC-SHA256 by hand, so any key can be used, the empty one included.
func hs256(t *testing.T, kid string, key []byte, c jwt.Claims) string {
	t.Helper()
	header := map[string]string{"alg": "HS256", "typ": "JWT"}
	if kid != "" {
		header["kid"] = kid
	}
	h, _ := json.Marshal(header)
	p, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	signing := b64(h) + "." + b64(p)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(signing))
	return signing + "." + b64(mac.Sum(nil))
}

var aliceGrants = []Grant{{OrganizationID: "acme", ProjectID: "web", Role: RoleOperator}, {OrganizationID: "globex", Role: RoleAdmin}}

// goodClaims are valid at now for keys with the default issuer, audience and skew.
func goodClaims(now time.Time) claims {
	return claims{RegisteredClaims: jwt.RegisteredClaims{
		Issuer: defaultIssuer, Subject: "alice", Audience: jwt.ClaimStrings{defaultAudience},
		IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour)),
	}, Grants: aliceGrants}
}

// TestVerify runs every check against every algorithm: the keys accept HS256 with a
// secret and RS256 and ES256 from a key set file holding one key of each.
func TestVerify(t *testing.T) {
	tk := testKeys()
	now := time.Unix(1_800_000_000, 0)
	file := writeJWKS(t, rsaJWK("rsa-1", &tk.rsa.PublicKey), ecJWK("ec-1", &tk.ec.PublicKey))
	both, err := New(Config{Secret: secret, JWKSFile: file})
	if err != nil {
		t.Fatal(err)
	}
	jwksOnly, err := New(Config{JWKSFile: file})
	if err != nil {
		t.Fatal(err)
	}
	twoRSA, err := New(Config{JWKSFile: writeJWKS(t, rsaJWK("rsa-1", &tk.rsa.PublicKey), rsaJWK("rsa-2", &tk.rsa2.PublicKey))})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []*Keys{both, jwksOnly, twoRSA} {
		at(k, now)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&tk.rsa.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})

	type signer struct {
		name string
		sign func(claims) string
	}
	signers := []signer{
		{"HS256", func(c claims) string { return signToken(t, jwt.SigningMethodHS256, "", secret, c) }},
		{"RS256", func(c claims) string { return signToken(t, jwt.SigningMethodRS256, "rsa-1", tk.rsa, c) }},
		{"ES256", func(c claims) string { return signToken(t, jwt.SigningMethodES256, "ec-1", tk.ec, c) }},
	}
	with := func(f func(*claims)) claims { c := goodClaims(now); f(&c); return c }
	good := goodClaims(now)

	type test struct {
		name  string
		keys  *Keys
		token string
		want  error // nil: accepted
	}
	var tests []test
	// The claim checks, for each algorithm.
	for _, s := range signers {
		for _, c := range []struct {
			name   string
			claims claims
			want   error
		}{
			{"valid", good, nil},
			{"expired within skew", with(func(c *claims) { c.ExpiresAt = jwt.NewNumericDate(now.Add(-29 * time.Second)) }), nil},
			{"expired beyond skew", with(func(c *claims) { c.ExpiresAt = jwt.NewNumericDate(now.Add(-31 * time.Second)) }), jwt.ErrTokenExpired},
			{"nbf within skew", with(func(c *claims) { c.NotBefore = jwt.NewNumericDate(now.Add(29 * time.Second)) }), nil},
			{"nbf in the future", with(func(c *claims) { c.NotBefore = jwt.NewNumericDate(now.Add(31 * time.Second)) }), jwt.ErrTokenNotValidYet},
			{"wrong issuer", with(func(c *claims) { c.Issuer = "evil" }), jwt.ErrTokenInvalidIssuer},
			{"no issuer", with(func(c *claims) { c.Issuer = "" }), jwt.ErrTokenRequiredClaimMissing},
			{"wrong audience", with(func(c *claims) { c.Audience = jwt.ClaimStrings{"other"} }), jwt.ErrTokenInvalidAudience},
			{"one of the audiences", with(func(c *claims) { c.Audience = jwt.ClaimStrings{"other", defaultAudience} }), nil},
			{"no subject", with(func(c *claims) { c.Subject = "" }), errNoSubject},
			{"longest subject", with(func(c *claims) { c.Subject = strings.Repeat("s", MaxSubjectBytes) }), nil},
			{"subject too long", with(func(c *claims) { c.Subject = strings.Repeat("s", MaxSubjectBytes+1) }), errLongSubject},
			{"no expiry", with(func(c *claims) { c.ExpiresAt = nil }), jwt.ErrTokenRequiredClaimMissing},
			{"project admin", with(func(c *claims) { c.Grants = []Grant{{OrganizationID: "acme", ProjectID: "web", Role: RoleAdmin}} }), ErrInvalidToken},
			{"unknown role", with(func(c *claims) { c.Grants = []Grant{{OrganizationID: "acme", Role: "root"}} }), ErrInvalidToken},
		} {
			tests = append(tests, test{s.name + " " + c.name, both, s.sign(c.claims), c.want})
		}
		tests = append(tests, test{s.name + " tampered payload", both, tamper(s.sign(good)), jwt.ErrTokenSignatureInvalid})
	}
	tests = append(tests, []test{
		// Signatures and key choice.
		{"HS256 other secret", both, signToken(t, jwt.SigningMethodHS256, "", []byte("another-secret-another-secret-xx"), good), jwt.ErrTokenSignatureInvalid},
		{"RS256 other key, same kid", both, signToken(t, jwt.SigningMethodRS256, "rsa-1", tk.rsaOther, good), jwt.ErrTokenSignatureInvalid},
		{"ES256 other key, same kid", both, signToken(t, jwt.SigningMethodES256, "ec-1", tk.ecOther, good), jwt.ErrTokenSignatureInvalid},
		{"unknown kid", both, signToken(t, jwt.SigningMethodRS256, "rsa-9", tk.rsa, good), errUnknownKey},
		{"RS256 header, EC kid", both, signToken(t, jwt.SigningMethodRS256, "ec-1", tk.rsa, good), errKeyMismatch},
		{"ES256 header, RSA kid", both, signToken(t, jwt.SigningMethodES256, "rsa-1", tk.ec, good), errKeyMismatch},
		{"RS256 without kid, one RSA key", both, signToken(t, jwt.SigningMethodRS256, "", tk.rsa, good), nil},
		{"ES256 without kid, one EC key", both, signToken(t, jwt.SigningMethodES256, "", tk.ec, good), nil},
		{"RS256 without kid, two RSA keys", twoRSA, signToken(t, jwt.SigningMethodRS256, "", tk.rsa, good), errNoKey},
		{"RS256 with kid, two RSA keys", twoRSA, signToken(t, jwt.SigningMethodRS256, "rsa-2", tk.rsa2, good), nil},
		{"kid not a string", both, func() string {
			tok := jwt.NewWithClaims(jwt.SigningMethodRS256, good)
			tok.Header["kid"] = 1
			s, _ := tok.SignedString(tk.rsa)
			return s
		}(), jwt.ErrTokenUnverifiable},
		{"critical header extension", both, func() string {
			tok := jwt.NewWithClaims(jwt.SigningMethodRS256, good)
			tok.Header["kid"] = "rsa-1"
			tok.Header["crit"] = []string{"exp-ext"}
			s, _ := tok.SignedString(tk.rsa)
			return s
		}(), jwt.ErrTokenUnverifiable},
		// Algorithms.
		{"alg none", both, signToken(t, jwt.SigningMethodNone, "", jwt.UnsafeAllowNoneSignatureType, good), errAlgorithm},
		{"HS384", both, signToken(t, jwt.SigningMethodHS384, "", secret, good), errAlgorithm},
		{"RS384 with an RSA kid", both, signToken(t, jwt.SigningMethodRS384, "rsa-1", tk.rsa, good), errAlgorithm},
		{"PS256 with an RSA kid", both, signToken(t, jwt.SigningMethodPS256, "rsa-1", tk.rsa, good), errAlgorithm},
		// Alg confusion: the RSA public key, which anyone may hold, as an HMAC secret.
		{"HS256 keyed with the public PEM, no secret", jwksOnly, hs256(t, "", pubPEM, good), errAlgorithm},
		{"HS256 keyed with the public PEM and naming its kid, no secret", jwksOnly, hs256(t, "rsa-1", pubPEM, good), errAlgorithm},
		{"HS256 keyed with the public DER, no secret", jwksOnly, hs256(t, "rsa-1", pubDER, good), errAlgorithm},
		{"HS256 keyed with nothing, no secret", jwksOnly, hs256(t, "", nil, good), errAlgorithm},
		{"HS256 keyed with the public PEM and naming its kid, with a secret", both, hs256(t, "rsa-1", pubPEM, good), jwt.ErrTokenSignatureInvalid},
		{"RS256 on keys without a secret", jwksOnly, signToken(t, jwt.SigningMethodRS256, "rsa-1", tk.rsa, good), nil},
		{"garbage", both, "not.a.token", jwt.ErrTokenMalformed},
	}...)

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := tt.keys.Verify(tt.token)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Verify = %v, want accepted", err)
				}
				if p.Subject != "alice" && len(p.Subject) != MaxSubjectBytes || !reflect.DeepEqual(p.Grants, aliceGrants) {
					t.Errorf("principal = %+v", p)
				}
				return
			}
			if !errors.Is(err, ErrInvalidToken) || !errors.Is(err, tt.want) {
				t.Errorf("Verify = %v, want ErrInvalidToken and %v", err, tt.want)
			}
			// A signature is refused only after checking it with a key of the alg's type.
			if errors.Is(err, jwt.ErrInvalidKeyType) {
				t.Errorf("Verify = %v: a key of the wrong type was chosen", err)
			}
		})
	}
}

// TestPrincipalExpires: Verify fills Expires from exp, in UTC, also from the cache, for
// every algorithm.
func TestPrincipalExpires(t *testing.T) {
	tk := testKeys()
	now := time.Unix(1_800_000_000, 0)
	k, err := New(Config{Secret: secret, JWKSFile: writeJWKS(t, rsaJWK("rsa-1", &tk.rsa.PublicKey), ecJWK("ec-1", &tk.ec.PublicKey))})
	if err != nil {
		t.Fatal(err)
	}
	at(k, now)
	c := goodClaims(now)
	c.ExpiresAt = jwt.NewNumericDate(now.Add(90 * time.Minute))
	want := now.Add(90 * time.Minute).UTC()
	for alg, tok := range map[string]string{
		"HS256": signToken(t, jwt.SigningMethodHS256, "", secret, c),
		"RS256": signToken(t, jwt.SigningMethodRS256, "rsa-1", tk.rsa, c),
		"ES256": signToken(t, jwt.SigningMethodES256, "ec-1", tk.ec, c),
	} {
		first, err := k.Verify(tok)
		if err != nil {
			t.Fatalf("%s: %v", alg, err)
		}
		if first.Expires != want {
			t.Errorf("%s: Expires = %v, want %v", alg, first.Expires, want)
		}
		if first.Deadline != want.Add(defaultClockSkew) {
			t.Errorf("%s: Deadline = %v, want exp plus the skew, %v", alg, first.Deadline, want.Add(defaultClockSkew))
		}
		if _, ok := k.verified.Get(tok); !ok {
			t.Errorf("%s: a verified token is not cached", alg)
		}
		cached, err := k.Verify(tok)
		if err != nil || !reflect.DeepEqual(cached, first) {
			t.Errorf("%s: from the cache %+v, %v; want %+v", alg, cached, err, first)
		}
	}
}

// TestConfig: defaults, bounds, and that issuer and audience apply to minting and verifying.
func TestConfig(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	alice := Principal{Subject: "alice", Grants: aliceGrants}
	for _, tt := range []struct {
		name    string
		cfg     Config
		wantErr string // substring; "" when New succeeds
	}{
		{"nothing to verify with", Config{Issuer: "x"}, "need a secret, a JWKS file or an OIDC issuer"},
		{"short secret", Config{Secret: []byte("short")}, "at least 32"},
		{"skew too large", Config{Secret: secret, ClockSkew: 6 * time.Minute}, "not between 0 and 5m0s"},
		{"negative skew", Config{Secret: secret, ClockSkew: -time.Second}, "not between 0 and 5m0s"},
		{"largest skew", Config{Secret: secret, ClockSkew: 5 * time.Minute}, ""},
		{"missing JWKS file", Config{JWKSFile: filepath.Join(t.TempDir(), "none.json")}, "read JWKS file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("New = %v, want %q", err, tt.wantErr)
			}
		})
	}

	t.Run("issuer, audience and skew", func(t *testing.T) {
		custom, err := New(Config{Secret: secret, Issuer: "https://id.example", Audience: "api", ClockSkew: 2 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defaults := mustKeys(t, secret)
		at(custom, now)
		at(defaults, now)
		tok, err := custom.Mint(alice, now.Add(-time.Hour-90*time.Second), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := custom.Verify(tok); err != nil {
			t.Errorf("expired 90s ago with a skew of 2m: %v", err)
		}
		at(defaults, now.Add(-time.Hour))
		if _, err := defaults.Verify(tok); !errors.Is(err, jwt.ErrTokenInvalidIssuer) {
			t.Errorf("custom issuer on default keys: %v", err)
		}
		var c claims
		if _, _, err := jwt.NewParser().ParseUnverified(tok, &c); err != nil {
			t.Fatal(err)
		}
		if c.Issuer != "https://id.example" || !reflect.DeepEqual(c.Audience, jwt.ClaimStrings{"api"}) {
			t.Errorf("minted iss %q aud %v", c.Issuer, c.Audience)
		}
	})
}

// tamper rewrites the payload's subject but keeps the signature.
func tamper(tok string) string {
	parts := strings.Split(tok, ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		panic(err)
	}
	var c map[string]any
	if err := json.Unmarshal(payload, &c); err != nil {
		panic(err)
	}
	c["sub"] = "mallory"
	payload, _ = json.Marshal(c)
	parts[1] = b64(payload)
	return strings.Join(parts, ".")
}
