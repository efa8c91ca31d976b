package auth

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	lru "github.com/hashicorp/golang-lru/v2"
)

// Tokens are JWTs with the registered claims sub and exp (both required), nbf, iat, iss and
// aud, plus a "grants" claim listing Grants.
const (
	defaultIssuer   = "computeql"
	defaultAudience = "computeql"
	// defaultClockSkew is how far the clocks of the signing and verifying machines may
	// disagree, unless configured otherwise.
	defaultClockSkew = 30 * time.Second
	// maxClockSkew bounds the configured skew: it extends every token's life by as much.
	maxClockSkew = 5 * time.Minute
	// MinSecretBytes is the shortest HS256 secret accepted: HMAC-SHA256 is only as strong as
	// its key, and RFC 7518 asks for at least the hash size.
	MinSecretBytes = 32
)

var (
	// ErrInvalidToken is wrapped by every verification failure.
	ErrInvalidToken = errors.New("invalid token")
	// ErrNoSecret is returned by Mint when the keys have no HS256 secret to sign with.
	ErrNoSecret = errors.New("no HS256 secret to sign tokens with")

	// errAlgorithm: the token's alg is not one these keys verify.
	errAlgorithm = errors.New("algorithm not accepted")
	// errNoSubject: the token has no sub claim.
	errNoSubject = errors.New("no subject")
	// errLongSubject: the sub claim is longer than MaxSubjectBytes.
	errLongSubject = fmt.Errorf("subject longer than %d bytes", MaxSubjectBytes)
)

// MaxSubjectBytes bounds a principal's subject, which every change and event records.
const MaxSubjectBytes = 256

type claims struct {
	jwt.RegisteredClaims
	Grants []Grant `json:"grants"`
}

// verifiedCacheSize bounds the cache of verified tokens: clients reuse one token for many
// requests, and verifying costs a tenth of a create.
const verifiedCacheSize = 10_000

// Config says which tokens Keys accept. At least one of Secret, JWKSFile and OIDCIssuer is
// required; with several, a token may be signed by any of them.
type Config struct {
	// Secret verifies HS256 tokens and is what Mint signs with; at least MinSecretBytes long.
	// Without it HS256 tokens are refused and Mint fails.
	Secret []byte
	// JWKSFile is a JSON Web Key Set (RFC 7517) file whose RS256 and ES256 (P-256) keys
	// verify tokens. It is read once, by New.
	JWKSFile string
	// OIDCIssuer is the URL of an OpenID Connect issuer whose key set verifies RS256 and
	// ES256 tokens. New reads its discovery document and key set; Verify reads the key set
	// again when a token names a kid it does not know, at most once per 30 s. It must be
	// https, or http to a loopback address.
	OIDCIssuer string
	// Issuer is the iss claim every token must carry and Mint writes. Defaults to OIDCIssuer
	// when that is set, else "computeql".
	Issuer string
	// Audience is the value the aud claim of every token must include and Mint writes.
	// Defaults to "computeql".
	Audience string
	// ClockSkew is how far the clocks of a token's signer and of this process may disagree,
	// allowed on exp and nbf. Defaults to 30s; at most 5 minutes.
	ClockSkew time.Duration
}

// withDefaults returns the configuration with its defaults applied, or why it is unusable.
func (c Config) withDefaults() (Config, error) {
	if len(c.Secret) == 0 && c.JWKSFile == "" && c.OIDCIssuer == "" {
		return c, errors.New("tokens need a secret, a JWKS file or an OIDC issuer to be verified with")
	}
	if len(c.Secret) > 0 && len(c.Secret) < MinSecretBytes {
		return c, fmt.Errorf("token secret is %d bytes; it must be at least %d", len(c.Secret), MinSecretBytes)
	}
	if c.ClockSkew < 0 || c.ClockSkew > maxClockSkew {
		return c, fmt.Errorf("token clock skew %s is not between 0 and %s", c.ClockSkew, maxClockSkew)
	}
	c.Issuer = cmp.Or(c.Issuer, c.OIDCIssuer, defaultIssuer)
	c.Audience = cmp.Or(c.Audience, defaultAudience)
	c.ClockSkew = cmp.Or(c.ClockSkew, defaultClockSkew)
	return c, nil
}

// Keys verifies tokens signed with an HS256 secret or with RS256 and ES256 keys from JSON Web
// Key Sets, and mints HS256 tokens. It is safe for concurrent use.
type Keys struct {
	secret []byte
	// file is the key set of Config.JWKSFile and oidc that of Config.OIDCIssuer; nil when
	// not configured.
	file *keySet
	oidc *oidcKeys

	issuer, audience string
	skew             time.Duration
	parser           *jwt.Parser
	now              func() time.Time
	// verified caches the principals of tokens that passed verification, until they expire.
	// The key is the whole token, signature included, so a cache hit is as good as a
	// verification. A cached token stays accepted until it expires even if the issuer
	// rotates its key out meanwhile, as it would be for a verifier that never refreshed.
	verified *lru.Cache[string, Principal]
}

// New returns keys for the configuration. With an OIDC issuer it fetches the issuer's key
// set before returning.
func New(cfg Config) (*Keys, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	verified, err := lru.New[string, Principal](verifiedCacheSize)
	if err != nil {
		return nil, err
	}
	k := &Keys{
		secret: cfg.Secret, issuer: cfg.Issuer, audience: cfg.Audience, skew: cfg.ClockSkew,
		now: time.Now, verified: verified,
	}
	if cfg.JWKSFile != "" {
		data, err := os.ReadFile(cfg.JWKSFile)
		if err != nil {
			return nil, fmt.Errorf("read JWKS file: %w", err)
		}
		if k.file, err = parseKeySet(data); err != nil {
			return nil, fmt.Errorf("JWKS file %s: %w", cfg.JWKSFile, err)
		}
	}
	if cfg.OIDCIssuer != "" {
		if k.oidc, err = newOIDCKeys(cfg.OIDCIssuer, k.now()); err != nil {
			return nil, fmt.Errorf("OIDC issuer %s: %w", cfg.OIDCIssuer, err)
		}
	}
	// The accepted algorithms are decided by verificationKey alone, which every token passes.
	k.parser = jwt.NewParser(
		jwt.WithIssuer(k.issuer),
		jwt.WithAudience(k.audience),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(k.skew),
		jwt.WithTimeFunc(func() time.Time { return k.now() }),
		// Without it a signature with its unused low bits changed still verifies, so one
		// token would have several spellings.
		jwt.WithStrictDecoding(),
	)
	return k, nil
}

// NewKeys returns keys that verify and mint HS256 tokens with the secret, which must be at
// least MinSecretBytes long, with the default issuer, audience and clock skew.
func NewKeys(secret []byte) (*Keys, error) {
	return New(Config{Secret: secret})
}

// RandomSecret returns a fresh secret for a process that was given none.
func RandomSecret() []byte {
	b := make([]byte, MinSecretBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return []byte(hex.EncodeToString(b))
}

// Mint signs an HS256 token for the principal valid from now for ttl. It fails with
// ErrNoSecret when the keys have no secret. The principal's Expires is ignored.
func (k *Keys) Mint(p Principal, now time.Time, ttl time.Duration) (string, error) {
	if len(k.secret) == 0 {
		return "", fmt.Errorf("mint token: %w", ErrNoSecret)
	}
	if p.Subject == "" {
		return "", errors.New("mint token: empty subject")
	}
	if len(p.Subject) > MaxSubjectBytes {
		return "", fmt.Errorf("mint token: %w", errLongSubject)
	}
	for _, g := range p.Grants {
		if err := g.Validate(); err != nil {
			return "", fmt.Errorf("mint token: %w", err)
		}
	}
	c := claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    k.issuer,
			Subject:   p.Subject,
			Audience:  jwt.ClaimStrings{k.audience},
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
	if p, ok := k.verified.Get(token); ok {
		if p.ValidAt(k.now()) {
			return p, nil
		}
		k.verified.Remove(token)
	}
	if i := strings.IndexFunc(token, notCompact); i >= 0 {
		return Principal{}, fmt.Errorf("%w: byte %d is not base64url or a dot", ErrInvalidToken, i)
	}
	var c claims
	if _, err := k.parser.ParseWithClaims(token, &c, k.verificationKey); err != nil {
		return Principal{}, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	if c.Subject == "" {
		return Principal{}, fmt.Errorf("%w: %w", ErrInvalidToken, errNoSubject)
	}
	if len(c.Subject) > MaxSubjectBytes {
		return Principal{}, fmt.Errorf("%w: %w", ErrInvalidToken, errLongSubject)
	}
	for _, g := range c.Grants {
		if err := g.Validate(); err != nil {
			return Principal{}, fmt.Errorf("%w: %w", ErrInvalidToken, err)
		}
	}
	// exp is present: the parser requires it.
	p := Principal{Subject: c.Subject, Grants: c.Grants, Expires: c.ExpiresAt.UTC(), Deadline: c.ExpiresAt.UTC().Add(k.skew)}
	k.verified.Add(token, p)
	return p, nil
}

// notCompact reports a rune that cannot occur in a JWS compact serialisation (RFC 7515 §7.1).
// The base64 decoder skips line breaks, even in strict mode, so without this check a token
// with a line break added would verify too.
func notCompact(r rune) bool {
	return !('A' <= r && r <= 'Z' || 'a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '-' || r == '_' || r == '.')
}

// verificationKey returns the key for the token's alg, and is the one place that decides
// which algorithms are accepted. The key's type follows from the alg, never the other way
// round: an HS256 token only ever gets the secret, whatever kid it names, because a public
// key used as an HMAC secret would let anyone holding it sign tokens.
func (k *Keys) verificationKey(t *jwt.Token) (any, error) {
	// RFC 7515 §4.1.11: a token with critical header extensions must be refused by a
	// verifier that understands none of them.
	if _, ok := t.Header["crit"]; ok {
		return nil, errors.New("critical header extensions are not supported")
	}
	switch alg := t.Method.Alg(); alg {
	case jwt.SigningMethodHS256.Alg():
		if len(k.secret) == 0 {
			return nil, fmt.Errorf("%w: %s, no secret is configured", errAlgorithm, alg)
		}
		return k.secret, nil
	case jwt.SigningMethodRS256.Alg(), jwt.SigningMethodES256.Alg():
		kid, ok := t.Header["kid"].(string)
		if !ok && t.Header["kid"] != nil {
			return nil, errors.New("kid is not a string")
		}
		return k.publicKey(kid, alg)
	default:
		return nil, fmt.Errorf("%w: %q", errAlgorithm, alg)
	}
}

// publicKey finds the key for kid and alg, refreshing the OIDC issuer's key set once when
// the kid is unknown: that is how a key the issuer has rotated in is learnt.
func (k *Keys) publicKey(kid, alg string) (any, error) {
	key, err := findKey(k.keySets(), kid, alg)
	if errors.Is(err, errUnknownKey) && k.oidc != nil {
		if rerr := k.oidc.refresh(k.now()); rerr != nil {
			return nil, fmt.Errorf("%w; refreshing the OIDC key set: %w", err, rerr)
		}
		key, err = findKey(k.keySets(), kid, alg)
	}
	return key, err
}

func (k *Keys) keySets() []*keySet {
	var sets []*keySet
	if k.file != nil {
		sets = append(sets, k.file)
	}
	if k.oidc != nil {
		sets = append(sets, k.oidc.keys())
	}
	return sets
}
