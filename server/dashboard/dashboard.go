// Package dashboard serves computeql's web dashboard: sign in with a bearer token, pick an
// organization and project, watch their instances change live, create instances, act on them
// and read their history.
//
// The page is plain HTML, CSS and JavaScript without a framework or a build step, embedded in
// the binary and served from the API's own origin (see package webasset), so it works on an
// air-gapped network and `make run` needs nothing besides Go. Everything it shows comes from
// the public GraphQL API: the table is fed by the instanceEvents subscription over a WebSocket
// that authenticates in connection_init, and queries and mutations go over HTTP with the
// same token.
package dashboard

import (
	"embed"
	"fmt"
	"io/fs"
	"net/http"

	"github.com/computeql/computeql/server/webasset"
)

// AssetsDir is the path below which the handler serves the page's scripts and styles; mount
// the handler on it besides the page's own path.
const AssetsDir = "/dashboard/assets/"

//go:embed page.html.tmpl
var pageFS embed.FS

//go:embed assets/*.js assets/*.css
var assetFS embed.FS

var pageTmpl = webasset.ParseTemplate(pageFS, "page.html.tmpl")

// Handler serves the dashboard page at any path that is not below AssetsDir (mount it on "/"
// exactly) and its assets below AssetsDir. endpoint is the GraphQL path the page talks to and
// graphiql the path of the GraphiQL page it links to; both must be same-origin absolute paths,
// or Handler panics, as http.ServeMux does for a bad pattern.
func Handler(endpoint, graphiql string) http.Handler {
	for _, p := range []string{endpoint, graphiql} {
		if !webasset.IsLocalPath(p) {
			panic(fmt.Sprintf("dashboard: %q is not a same-origin absolute path", p))
		}
	}
	own, err := fs.Sub(assetFS, "assets")
	if err != nil {
		panic(err)
	}
	assets := webasset.NewSet(AssetsDir, own, webasset.Shared())
	page := webasset.NewPage(pageTmpl, assets, struct{ Endpoint, GraphiQL string }{endpoint, graphiql})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if assets.Owns(r.URL.Path) {
			assets.ServeHTTP(w, r)
			return
		}
		page.ServeHTTP(w, r)
	})
}
