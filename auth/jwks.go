package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// minRSABits is the smallest RSA modulus accepted: RFC 7518 requires 2048 bits for RS256.
const minRSABits = 2048

// publicKey is one usable key of a JSON Web Key Set. alg is RS256 for an *rsa.PublicKey and
// ES256 for a P-256 *ecdsa.PublicKey, never anything else, so a key looked up by alg always
// has the type that alg's verifier expects.
type publicKey struct {
	kid string
	alg string
	key crypto.PublicKey
}

// keySet is the usable signature keys of one JSON Web Key Set (RFC 7517).
type keySet struct {
	keys []publicKey
}

// jsonWebKey holds the members of a JWK that matter here; the rest (x5c, key_ops…) is ignored.
type jsonWebKey struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

// parseKeySet reads a JSON Web Key Set and keeps its RS256 and ES256 signature keys. Keys of
// another type, curve, algorithm or use are skipped, because issuers publish encryption keys
// and other algorithms in the same set; a set left with no usable key is an error that lists
// why each was skipped. A key of a usable kind that does not decode is an error, not skipped:
// it is a broken set, and skipping it would hide the mistake until a token names the key.
func parseKeySet(data []byte) (*keySet, error) {
	var doc struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("not a JSON Web Key Set: %w", err)
	}
	set := &keySet{}
	var skipped []string
	for i, raw := range doc.Keys {
		var jwk jsonWebKey
		if err := json.Unmarshal(raw, &jwk); err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
		name := fmt.Sprintf("key %d (kid %q)", i, jwk.Kid)
		k, why, err := jwk.publicKey()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if why != "" {
			skipped = append(skipped, name+": "+why)
			continue
		}
		if k.kid != "" {
			if _, err := set.find(k.kid, k.alg); err == nil {
				return nil, fmt.Errorf("%s: a second %s key with the same kid", name, k.alg)
			}
		}
		set.keys = append(set.keys, k)
	}
	if len(set.keys) == 0 {
		if len(skipped) == 0 {
			return nil, errors.New("no keys")
		}
		return nil, fmt.Errorf("no RS256 or ES256 signature key; skipped %s", strings.Join(skipped, "; "))
	}
	return set, nil
}

// publicKey decodes the key, or says why it is not a usable signature key.
func (j jsonWebKey) publicKey() (k publicKey, skipped string, err error) {
	if j.Use != "" && j.Use != "sig" {
		return publicKey{}, fmt.Sprintf("use %q", j.Use), nil
	}
	switch j.Kty {
	case "RSA":
		if j.Alg != "" && j.Alg != "RS256" {
			return publicKey{}, fmt.Sprintf("alg %q", j.Alg), nil
		}
		key, err := j.rsaKey()
		if err != nil {
			return publicKey{}, "", err
		}
		if key.N.BitLen() < minRSABits {
			return publicKey{}, fmt.Sprintf("RSA key of %d bits, fewer than %d", key.N.BitLen(), minRSABits), nil
		}
		return publicKey{kid: j.Kid, alg: "RS256", key: key}, "", nil
	case "EC":
		if j.Alg != "" && j.Alg != "ES256" {
			return publicKey{}, fmt.Sprintf("alg %q", j.Alg), nil
		}
		if j.Crv != "P-256" {
			return publicKey{}, fmt.Sprintf("curve %q", j.Crv), nil
		}
		key, err := j.p256Key()
		if err != nil {
			return publicKey{}, "", err
		}
		return publicKey{kid: j.Kid, alg: "ES256", key: key}, "", nil
	default:
		return publicKey{}, fmt.Sprintf("kty %q", j.Kty), nil
	}
}

func (j jsonWebKey) rsaKey() (*rsa.PublicKey, error) {
	n, err := base64.RawURLEncoding.DecodeString(j.N)
	if err != nil || len(n) == 0 {
		return nil, errors.New("RSA modulus n is not a base64url integer")
	}
	e, err := base64.RawURLEncoding.DecodeString(j.E)
	if err != nil || len(e) == 0 || len(e) > 4 {
		return nil, fmt.Errorf("RSA exponent e is not a base64url integer of at most 4 bytes")
	}
	exp := new(big.Int).SetBytes(e).Int64()
	// crypto/rsa accepts only odd exponents from 3 to 2³¹-1.
	if exp < 3 || exp%2 == 0 || exp > 1<<31-1 {
		return nil, fmt.Errorf("RSA exponent %d is not an odd number from 3 to 2^31-1", exp)
	}
	return &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(exp)}, nil
}

func (j jsonWebKey) p256Key() (*ecdsa.PublicKey, error) {
	x, errX := base64.RawURLEncoding.DecodeString(j.X)
	y, errY := base64.RawURLEncoding.DecodeString(j.Y)
	// RFC 7518 §6.2.1.2: each coordinate is exactly the curve's size, 32 bytes for P-256.
	if errX != nil || errY != nil || len(x) != 32 || len(y) != 32 {
		return nil, errors.New("P-256 coordinates x and y must each be 32 bytes of base64url")
	}
	key, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
	if err != nil {
		return nil, fmt.Errorf("P-256 key: %w", err)
	}
	return key, nil
}

// Why a key could not be found for a token; each is wrapped with the kid and alg.
var (
	// errUnknownKey: the token names a kid no key set holds. Only this one triggers a refresh
	// of an OIDC issuer's key set, which is how a rotated-in key is learnt.
	errUnknownKey = errors.New("no key has the token's kid")
	// errKeyMismatch: the kid names a key of another algorithm than the token's.
	errKeyMismatch = errors.New("the token's kid names a key of another algorithm")
	// errNoKey: the token names no kid and not exactly one key fits its alg.
	errNoKey = errors.New("the token names no kid and not exactly one key fits its alg")
)

// find returns the key for a token's kid and alg. A token without a kid gets the only key of
// its alg; with several such keys there is no telling which one was meant.
func (s *keySet) find(kid, alg string) (crypto.PublicKey, error) {
	return findKey([]*keySet{s}, kid, alg)
}

// findKey is find across several sets, which must agree: a kid for an alg found in two sets
// is as ambiguous as two keys without kid.
func findKey(sets []*keySet, kid, alg string) (crypto.PublicKey, error) {
	var named bool
	var fits []crypto.PublicKey
	for _, s := range sets {
		for _, k := range s.keys {
			if kid != "" && k.kid != kid {
				continue
			}
			named = true
			if k.alg == alg {
				fits = append(fits, k.key)
			}
		}
	}
	switch {
	case len(fits) == 1:
		return fits[0], nil
	case kid == "":
		return nil, fmt.Errorf("%w (%d %s keys)", errNoKey, len(fits), alg)
	case !named:
		return nil, fmt.Errorf("%w %q", errUnknownKey, kid)
	case len(fits) == 0:
		return nil, fmt.Errorf("%w: kid %q is not an %s key", errKeyMismatch, kid, alg)
	default:
		return nil, fmt.Errorf("%d %s keys have kid %q", len(fits), alg, kid)
	}
}
