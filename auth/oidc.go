package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// minRefreshInterval is the least time between two fetches of an OIDC issuer's key set.
	// A refresh is triggered by a token naming an unknown kid, which anyone can send, so a
	// flood of such tokens must not become a flood of requests to the issuer.
	minRefreshInterval = 30 * time.Second
	// fetchTimeout bounds each request to the issuer: a Verify that triggers a refresh
	// waits for it.
	fetchTimeout = 10 * time.Second
	// maxDocumentBytes bounds what is read from the issuer; real key sets are a few kB.
	maxDocumentBytes = 1 << 20
)

// oidcKeys is the key set of an OpenID Connect issuer, fetched at start and again when a
// token names a kid it does not hold.
type oidcKeys struct {
	client  *http.Client
	jwksURI string
	// set is read by every Verify without a lock and replaced whole by a refresh.
	set atomic.Pointer[keySet]

	mu sync.Mutex // serialises fetches, so waiting verifiers share one
	// fetched is when the key set was last fetched, successfully or not: a failing issuer
	// is not asked more often than a working one.
	fetched time.Time
}

// newOIDCKeys reads the issuer's discovery document (OpenID Connect Discovery 1.0 §4) and
// the key set it points to.
func newOIDCKeys(issuer string, now time.Time) (*oidcKeys, error) {
	if err := checkURL(issuer); err != nil {
		return nil, err
	}
	o := &oidcKeys{client: &http.Client{
		Timeout: fetchTimeout,
		// A redirect must not downgrade to plain http either.
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 10 {
				return errors.New("stopped after 10 redirects")
			}
			return checkURL(req.URL.String())
		},
	}}
	var doc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if err := o.getJSON(strings.TrimSuffix(issuer, "/")+"/.well-known/openid-configuration", &doc); err != nil {
		return nil, err
	}
	// Discovery §4.3: the document must name the very issuer it was fetched for, or tokens
	// of one issuer could be checked with the keys of another.
	if doc.Issuer != issuer {
		return nil, fmt.Errorf("discovery document names issuer %q, not %q", doc.Issuer, issuer)
	}
	if err := checkURL(doc.JWKSURI); err != nil {
		return nil, fmt.Errorf("jwks_uri: %w", err)
	}
	o.jwksURI = doc.JWKSURI
	if err := o.fetch(now); err != nil {
		return nil, err
	}
	return o, nil
}

// keys returns the current key set.
func (o *oidcKeys) keys() *keySet { return o.set.Load() }

// refresh fetches the key set again unless it was fetched less than minRefreshInterval ago.
// Verifiers that waited for a concurrent refresh return without fetching and find its keys.
func (o *oidcKeys) refresh(now time.Time) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if now.Sub(o.fetched) < minRefreshInterval {
		return nil
	}
	return o.fetch(now)
}

// fetch replaces the key set with the issuer's current one; on error the old set stays.
// The caller holds mu or owns o exclusively.
func (o *oidcKeys) fetch(now time.Time) error {
	o.fetched = now
	var raw json.RawMessage
	if err := o.getJSON(o.jwksURI, &raw); err != nil {
		return err
	}
	set, err := parseKeySet(raw)
	if err != nil {
		return fmt.Errorf("key set %s: %w", o.jwksURI, err)
	}
	o.set.Store(set)
	return nil
}

func (o *oidcKeys) getJSON(u string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", u, err)
	}
	req.Header.Set("Accept", "application/json")
	res, err := o.client.Do(req)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", u, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("fetch %s: %s", u, res.Status)
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, maxDocumentBytes+1))
	if err != nil {
		return fmt.Errorf("fetch %s: %w", u, err)
	}
	if len(body) > maxDocumentBytes {
		return fmt.Errorf("fetch %s: larger than %d bytes", u, maxDocumentBytes)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("fetch %s: %w", u, err)
	}
	return nil
}

// checkURL accepts https URLs, and http ones to a loopback host for an issuer on the same
// machine: keys fetched over plain http across a network could be replaced on the way,
// and whoever replaces them can sign any token.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Host == "" {
		return fmt.Errorf("%q is not an absolute URL", raw)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if ip := net.ParseIP(u.Hostname()); u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback()) {
			return nil
		}
	}
	return errors.New(raw + " is neither https nor http to a loopback address")
}
