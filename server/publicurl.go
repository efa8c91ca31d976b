package server

import (
	"fmt"
	"net/http"
	"net/url"

	"github.com/computeql/computeql/graph"
)

// publicURL is where clients reach the API: configured, or as each request reached it.
type publicURL struct{ fixed *url.URL }

func newPublicURL(s string) (publicURL, error) {
	if s == "" {
		return publicURL{}, nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return publicURL{}, fmt.Errorf("server: PublicURL %q is not an http:// or https:// URL with a host", s)
	}
	return publicURL{fixed: &url.URL{Scheme: u.Scheme, Host: u.Host}}, nil
}

// mark puts where the request reached the API in its context, for the links the API makes.
func (p publicURL) mark(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u := url.URL{Scheme: "http", Host: r.Host}
		if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
			u.Scheme = "https"
		}
		if p.fixed != nil {
			u = *p.fixed
		}
		next.ServeHTTP(w, r.WithContext(graph.WithPublicURL(r.Context(), u)))
	})
}
