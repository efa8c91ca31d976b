package auth

import (
	"cmp"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// FuzzVerify: with a fixed secret and clock, a token verifies only if it is byte for byte one
// the secret minted, and then names what was minted; any other string fails with
// ErrInvalidToken, again on a second try (the cache of verified tokens must not change the
// answer). A fuzzer cannot compute an HMAC, so a verifying variant would be a forgery or a
// malleable encoding.
func FuzzVerify(f *testing.F) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	keys, err := NewKeys(secret)
	if err != nil {
		f.Fatal(err)
	}
	at(keys, now)
	minted := map[string]Principal{}
	var alice string
	for _, p := range []Principal{
		{Subject: "alice", Grants: aliceGrants},
		{Subject: "bob"},
		{Subject: "carol", Grants: []Grant{{OrganizationID: "acme", Role: RoleAdmin}}},
	} {
		tok, err := keys.Mint(p, now, time.Hour)
		if err != nil {
			f.Fatal(err)
		}
		p.Expires = now.Add(time.Hour)
		p.Deadline = p.Expires.Add(defaultClockSkew)
		minted[tok] = p
		alice = cmp.Or(alice, tok)
		f.Add(tok)
	}
	parts := strings.Split(alice, ".")
	for _, s := range []string{
		alice + "\n", alice + "=", parts[0] + "." + parts[1] + ".", parts[0] + "." + parts[1], "..", "", "a.b.c.d",
		parts[0] + "." + parts[1] + "." + flipLowBit(parts[2]),
		"eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0." + parts[1] + ".",
		signUnchecked(f, jwt.SigningMethodHS256, []byte("another-secret-another-secret-32"), goodClaims(now)),
		signUnchecked(f, jwt.SigningMethodHS384, secret, goodClaims(now)),
		signUnchecked(f, jwt.SigningMethodHS256, secret, claims{RegisteredClaims: jwt.RegisteredClaims{Subject: "x"}}),
		tamper(alice),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		p, err := keys.Verify(token)
		want, ok := minted[token]
		switch {
		case ok && (err != nil || !reflect.DeepEqual(p, want)):
			t.Fatalf("minted token verifies as %+v, %v; want %+v", p, err, want)
		case !ok && err == nil:
			t.Fatalf("%q verifies as %+v but was never minted", token, p)
		case !ok && !errors.Is(err, ErrInvalidToken):
			t.Fatalf("%q refused with %v, which does not wrap ErrInvalidToken", token, err)
		}
		if p2, err2 := keys.Verify(token); (err == nil) != (err2 == nil) || !reflect.DeepEqual(p, p2) {
			t.Fatalf("%q: second verification gives %+v, %v after %+v, %v", token, p2, err2, p, err)
		}
	})
}

// signUnchecked signs claims as given, without Mint's checks, for seeds Verify must refuse.
func signUnchecked(f *testing.F, method jwt.SigningMethod, key []byte, c jwt.Claims) string {
	f.Helper()
	s, err := jwt.NewWithClaims(method, c).SignedString(key)
	if err != nil {
		f.Fatal(err)
	}
	return s
}

// flipLowBit changes the last character of a base64url segment to its neighbour, which
// differs only in a bit that a 32-byte signature leaves unused.
func flipLowBit(seg string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, seg[len(seg)-1])
	return seg[:len(seg)-1] + string(alphabet[i^1])
}
