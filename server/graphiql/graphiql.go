// Package graphiql serves a GraphiQL IDE for the ComputeQL API.
//
// Every file the page needs (GraphiQL, React, ReactDOM and the page's own
// script and style) is embedded in the binary, because ComputeQL runs on
// air-gapped networks where a CDN is unreachable: the page must work, and the
// browser must not even try to contact another host. The
// Content-Security-Policy sent with the page enforces that in the browser.
// assets/VERSIONS records where the vendored files come from.
package graphiql

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed page.html.tmpl
var pageFS embed.FS

//go:embed assets/*.js assets/*.css
var assetFS embed.FS

// pageTmpl is parsed at init so a broken template fails every test and every
// start-up, not the first request.
var pageTmpl = template.Must(template.New("page.html.tmpl").Funcs(template.FuncMap{
	"asset": func(string) string { panic("asset is bound per Handler") },
}).ParseFS(pageFS, "page.html.tmpl"))

type asset struct {
	contentType string
	body        []byte
	etag        string
	version     string // short content hash, appended to URLs to bust caches
}

// contentTypes is fixed rather than taken from package mime, whose answer
// depends on the host's mime tables; browsers refuse scripts served with the
// wrong type under X-Content-Type-Options: nosniff.
var contentTypes = map[string]string{
	".js":  "text/javascript; charset=utf-8",
	".css": "text/css; charset=utf-8",
}

var assets = loadAssets()

func loadAssets() map[string]asset {
	entries, err := fs.ReadDir(assetFS, "assets")
	if err != nil {
		panic(err)
	}
	m := make(map[string]asset, len(entries))
	for _, e := range entries {
		body, err := fs.ReadFile(assetFS, "assets/"+e.Name())
		if err != nil {
			panic(err)
		}
		ct, ok := contentTypes[path.Ext(e.Name())]
		if !ok {
			panic("graphiql: no content type for embedded asset " + e.Name())
		}
		sum := sha256.Sum256(body)
		m[e.Name()] = asset{
			contentType: ct,
			body:        body,
			etag:        `"` + hex.EncodeToString(sum[:16]) + `"`,
			version:     hex.EncodeToString(sum[:6]),
		}
	}
	return m
}

// assetCacheControl lets browsers keep assets for a year without asking:
// their URLs carry a content hash, so a new build is fetched under a new URL.
const assetCacheControl = "public, max-age=31536000, immutable"

// Handler serves the GraphiQL page at prefix (e.g. "/graphiql") and its assets below prefix+"/assets/",
// talking to the GraphQL endpoint path (e.g. "/graphql").
//
// The page is served at both prefix and prefix+"/". The handler matches the
// full request path, so mount it on a mux for both patterns without
// http.StripPrefix. The endpoint must be a same-origin path: the page's
// Content-Security-Policy blocks requests to any other origin. Handler panics
// if prefix or endpoint is not such a path, as http.ServeMux does for a bad
// pattern, since either is a programming error.
func Handler(prefix, endpoint string) http.Handler {
	prefix = strings.TrimRight(prefix, "/")
	if prefix != "" && !isLocalPath(prefix) {
		panic(fmt.Sprintf("graphiql: prefix %q is not an absolute path", prefix))
	}
	if !isLocalPath(endpoint) {
		panic(fmt.Sprintf("graphiql: endpoint %q is not a same-origin absolute path", endpoint))
	}

	h := &handler{prefix: prefix, assetsDir: prefix + "/assets/"}
	tmpl := template.Must(pageTmpl.Clone()).Funcs(template.FuncMap{
		"asset": func(name string) (string, error) {
			a, ok := assets[name]
			if !ok {
				return "", fmt.Errorf("graphiql: page references unknown asset %q", name)
			}
			return h.assetsDir + name + "?v=" + a.version, nil
		},
	})
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, struct{ Endpoint string }{endpoint}); err != nil {
		panic(err)
	}
	h.page = buf.Bytes()
	sum := sha256.Sum256(h.page)
	h.pageETag = `"` + hex.EncodeToString(sum[:16]) + `"`
	return h
}

// isLocalPath rejects "//host" as well, which browsers read as another origin.
func isLocalPath(p string) bool {
	return strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "//") && !strings.ContainsAny(p, "\\\x00\r\n")
}

type handler struct {
	prefix    string
	assetsDir string
	page      []byte
	pageETag  string
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case p == h.prefix || p == h.prefix+"/":
		if !allowRead(w, r) {
			return
		}
		h.servePage(w, r)
	case strings.HasPrefix(p, h.assetsDir):
		a, ok := assets[strings.TrimPrefix(p, h.assetsDir)]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if !allowRead(w, r) {
			return
		}
		hdr := w.Header()
		hdr.Set("Content-Type", a.contentType)
		hdr.Set("Cache-Control", assetCacheControl)
		hdr.Set("ETag", a.etag)
		hdr.Set("X-Content-Type-Options", "nosniff")
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
	default:
		http.NotFound(w, r)
	}
}

func allowRead(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
	return false
}

func (h *handler) servePage(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	// The page names the current asset hashes, so it must be revalidated on
	// every load for a new build's assets to be picked up.
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("ETag", h.pageETag)
	hdr.Set("Content-Security-Policy", contentSecurityPolicy(r.Host))
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(h.page))
}

// contentSecurityPolicy keeps the browser on this origin. 'unsafe-inline' for
// styles only is what GraphiQL strictly needs: its dialogs (via
// react-remove-scroll) insert <style> elements at run time. Fonts and a few
// icons come as data: URLs inside graphiql.min.css. The explicit ws:/wss:
// sources are for the coming subscription transport, since older browsers do
// not count WebSocket URLs as 'self'.
func contentSecurityPolicy(host string) string {
	connect := "connect-src 'self'"
	if validHost(host) {
		connect += " ws://" + host + " wss://" + host
	}
	return strings.Join([]string{
		"default-src 'none'",
		"script-src 'self'",
		"style-src 'self' 'unsafe-inline'",
		"img-src 'self' data:",
		"font-src 'self' data:",
		connect,
		"base-uri 'none'",
		"form-action 'none'",
		"frame-ancestors 'none'",
	}, "; ")
}

// validHost admits only host[:port] characters, because the Host header is
// client-controlled and lands in a response header.
func validHost(host string) bool {
	if host == "" || len(host) > 255 {
		return false
	}
	for _, c := range host {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '-', c == ':', c == '[', c == ']':
		default:
			return false
		}
	}
	return true
}
