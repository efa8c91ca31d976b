// Package graphiql serves a GraphiQL IDE for the ComputeQL API.
//
// Every file the page needs (GraphiQL, React, ReactDOM, the WebSocket client
// shared with the dashboard, and the page's own script and style) is embedded
// in the binary, because ComputeQL runs on air-gapped networks where a CDN is
// unreachable: the page must work, and the browser must not even try to
// contact another host. The Content-Security-Policy sent with the page
// enforces that in the browser. assets/VERSIONS records where the vendored
// files come from.
package graphiql

import (
	"embed"
	"fmt"
	"io/fs"
	"net/http"
	"strings"

	"github.com/computeql/computeql/server/webasset"
)

//go:embed page.html.tmpl
var pageFS embed.FS

//go:embed assets/*.js assets/*.css
var assetFS embed.FS

var pageTmpl = webasset.ParseTemplate(pageFS, "page.html.tmpl")

// Handler serves the GraphiQL page at prefix (e.g. "/graphiql") and its assets below prefix+"/assets/",
// talking to the GraphQL endpoint path (e.g. "/graphql") over HTTP, and over a WebSocket for
// subscriptions.
//
// The page is served at both prefix and prefix+"/". The handler matches the
// full request path, so mount it on a mux for both patterns without
// http.StripPrefix. The endpoint must be a same-origin path: the page's
// Content-Security-Policy blocks requests to any other origin. Handler panics
// if prefix or endpoint is not such a path, as http.ServeMux does for a bad
// pattern, since either is a programming error.
func Handler(prefix, endpoint string) http.Handler {
	prefix = strings.TrimRight(prefix, "/")
	if prefix != "" && !webasset.IsLocalPath(prefix) {
		panic(fmt.Sprintf("graphiql: prefix %q is not an absolute path", prefix))
	}
	if !webasset.IsLocalPath(endpoint) {
		panic(fmt.Sprintf("graphiql: endpoint %q is not a same-origin absolute path", endpoint))
	}
	own, err := fs.Sub(assetFS, "assets")
	if err != nil {
		panic(err)
	}
	assets := webasset.NewSet(prefix+"/assets/", own, webasset.Shared())
	return &handler{
		prefix: prefix,
		assets: assets,
		page:   webasset.NewPage(pageTmpl, assets, struct{ Endpoint string }{endpoint}),
	}
}

type handler struct {
	prefix string
	assets *webasset.Set
	page   *webasset.Page
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch p := r.URL.Path; {
	case p == h.prefix || p == h.prefix+"/":
		h.page.ServeHTTP(w, r)
	case h.assets.Owns(p):
		h.assets.ServeHTTP(w, r)
	default:
		http.NotFound(w, r)
	}
}
