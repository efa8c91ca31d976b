package auth

import (
	"bytes"
	"maps"
	"slices"
	"strings"
	"testing"
)

func TestParseKeySet(t *testing.T) {
	tk := testKeys()
	rsa1 := rsaJWK("rsa-1", &tk.rsa.PublicKey)
	ec1 := ecJWK("ec-1", &tk.ec.PublicKey)
	with := func(k jwk, kv ...string) jwk {
		c := maps.Clone(k)
		for i := 0; i < len(kv); i += 2 {
			c[kv[i]] = kv[i+1]
		}
		return c
	}
	// A point off the curve: y of another key.
	offCurve := with(ec1, "y", ecJWK("", &tk.ec2.PublicKey)["y"])
	weak := with(rsa1, "kid", "weak", "n", b64(bytes.Repeat([]byte{0xff}, 128)))

	for _, tt := range []struct {
		name    string
		data    []byte
		want    []string // kid/alg of the keys kept
		wantErr string   // substring
	}{
		{"RSA and EC", jwksJSON(rsa1, ec1), []string{"rsa-1/RS256", "ec-1/ES256"}, ""},
		{"alg and use may be absent", jwksJSON(with(rsa1, "alg", "", "use", "")), []string{"rsa-1/RS256"}, ""},
		{"same kid, other kty", jwksJSON(rsa1, with(ec1, "kid", "rsa-1")), []string{"rsa-1/RS256", "rsa-1/ES256"}, ""},
		{"unusable keys are skipped", jwksJSON(
			with(rsa1, "kid", "enc", "use", "enc"),
			with(rsa1, "kid", "rs384", "alg", "RS384"),
			with(ec1, "kid", "p384", "crv", "P-384"),
			jwk{"kty": "oct", "kid": "sym", "k": "c2VjcmV0"},
			jwk{"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": "AA"},
			weak,
			ec1,
		), []string{"ec-1/ES256"}, ""},
		{"only unusable keys", jwksJSON(with(rsa1, "use", "enc"), weak), nil, `skipped key 0 (kid "rsa-1"): use "enc"; key 1 (kid "weak"): RSA key of 1024 bits, fewer than 2048`},
		{"no keys", jwksJSON(), nil, "no keys"},
		{"not JSON", []byte("{keys: nope"), nil, "not a JSON Web Key Set"},
		{"keys not a list", []byte(`{"keys": {"kty": "RSA"}}`), nil, "not a JSON Web Key Set"},
		{"member of the wrong type", []byte(`{"keys": [{"kty": 1}]}`), nil, "key 0"},
		{"duplicate kid", jwksJSON(rsa1, with(rsa1, "n", rsaJWK("", &tk.rsa2.PublicKey)["n"])), nil, `key 1 (kid "rsa-1"): a second RS256 key with the same kid`},
		{"RSA n not base64url", jwksJSON(with(rsa1, "n", "a+b/")), nil, "RSA modulus n"},
		{"RSA e missing", jwksJSON(with(rsa1, "e", "")), nil, "RSA exponent e"},
		{"RSA e even", jwksJSON(with(rsa1, "e", b64([]byte{1, 0, 0}))), nil, "RSA exponent 65536"},
		{"EC x short", jwksJSON(with(ec1, "x", b64(make([]byte, 31)))), nil, "32 bytes"},
		{"EC point off the curve", jwksJSON(offCurve), nil, "P-256 key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			set, err := parseKeySet(tt.data)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseKeySet = %v, want an error with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, k := range set.keys {
				got = append(got, k.kid+"/"+k.alg)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("kept %v, want %v", got, tt.want)
			}
		})
	}
}

// TestMalformedJWKSFileFailsAtStart: a broken file stops New with an error naming the file.
func TestMalformedJWKSFileFailsAtStart(t *testing.T) {
	name := writeFile(t, []byte(`{"keys": [`))
	_, err := New(Config{JWKSFile: name})
	if err == nil || !strings.Contains(err.Error(), "JWKS file "+name+": not a JSON Web Key Set") {
		t.Errorf("New = %v", err)
	}
}
