package auth

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
	lru "github.com/hashicorp/golang-lru/v2"
)

// Tokens are JWTs with these registered claims plus a "grants" claim listing Grants.
const (
	tokenIssuer   = "computeql"
	tokenAudience = "computeql"
	// clockSkew is how far the clocks of the minting and verifying machines may disagree.
	clockSkew = 30 * time.Second
	// MinSecretBytes is the shortest HS256 secret accepted: HMAC-SHA256 is only as strong as
	// its key, and RFC 7518 asks for at least the hash size.
	MinSecretBytes = 32
)

// ErrInvalidToken is wrapped by every verification failure.
var ErrInvalidToken = errors.New("invalid token")

type claims struct {
	jwt.RegisteredClaims
	Grants []Grant `json:"grants"`
}

// verifiedCacheSize bounds the cache of verified tokens: clients reuse one token for many
// requests, and verifying costs a tenth of a create.
const verifiedCacheSize = 10_000

// Keys mints and verifies HS256 tokens with one shared secret.
type Keys struct {
	secret []byte
	parser *jwt.Parser
	now    func() time.Time
	// verified caches the principals of tokens that passed verification, until they expire.
	verified *lru.Cache[string, verifiedToken]
}

type verifiedToken struct {
	principal Principal
	expires   time.Time
}

// NewKeys returns keys for the secret, which must be at least MinSecretBytes long.
func NewKeys(secret []byte) (*Keys, error) {
	if len(secret) < MinSecretBytes {
		return nil, fmt.Errorf("token secret is %d bytes; it must be at least %d", len(secret), MinSecretBytes)
	}
	verified, err := lru.New[string, verifiedToken](verifiedCacheSize)
	if err != nil {
		return nil, err
	}
	k := &Keys{secret: secret, now: time.Now, verified: verified}
	k.parser = jwt.NewParser(
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithIssuer(tokenIssuer),
		jwt.WithAudience(tokenAudience),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(clockSkew),
		jwt.WithTimeFunc(func() time.Time { return k.now() }),
	)
	return k, nil
}

// RandomSecret returns a fresh secret for a process that was given none.
func RandomSecret() []byte {
	b := make([]byte, MinSecretBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return []byte(hex.EncodeToString(b))
}

// Mint signs a token for the principal valid from now for ttl.
func (k *Keys) Mint(p Principal, now time.Time, ttl time.Duration) (string, error) {
	if p.Subject == "" {
		return "", errors.New("mint token: empty subject")
	}
	for _, g := range p.Grants {
		if err := g.Validate(); err != nil {
			return "", fmt.Errorf("mint token: %w", err)
		}
	}
	c := claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    tokenIssuer,
			Subject:   p.Subject,
			Audience:  jwt.ClaimStrings{tokenAudience},
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
		Grants: p.Grants,
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(k.secret)
	if err != nil {
		return "", fmt.Errorf("mint token: %w", err)
	}
	return s, nil
}

// Verify checks the token's signature, expiry, not-before, issuer and audience, and returns
// the principal it names. Errors wrap ErrInvalidToken. The principal may be shared with
// other callers of the same token and must not be modified.
func (k *Keys) Verify(token string) (Principal, error) {
	if v, ok := k.verified.Get(token); ok {
		if k.now().Before(v.expires.Add(clockSkew)) {
			return v.principal, nil
		}
		k.verified.Remove(token)
	}
	var c claims
	if _, err := k.parser.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return k.secret, nil }); err != nil {
		return Principal{}, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	if c.Subject == "" {
		return Principal{}, fmt.Errorf("%w: no subject", ErrInvalidToken)
	}
	for _, g := range c.Grants {
		if err := g.Validate(); err != nil {
			return Principal{}, fmt.Errorf("%w: %w", ErrInvalidToken, err)
		}
	}
	p := Principal{Subject: c.Subject, Grants: c.Grants}
	k.verified.Add(token, verifiedToken{principal: p, expires: c.ExpiresAt.Time})
	return p, nil
}
