// Package webasset serves the browser pages of computeql (GraphiQL and the dashboard) from
// files embedded in the binary.
//
// ComputeQL runs on air-gapped networks where a CDN is unreachable, so every file a page needs
// is embedded and served from the API's own origin, and the Content-Security-Policy sent with
// each page keeps the browser from even trying another host. Asset URLs carry a hash of their
// content, so browsers may cache them for a year and still pick up a new build at once.
package webasset

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

// shared holds the files every page may use besides its own: the GraphQL-over-WebSocket
// client, so that GraphiQL and the dashboard speak the subscription protocol with one code,
// and the icon.
//
//go:embed shared/*.js shared/*.svg
var shared embed.FS

// Shared returns the files every page may include (gqlws.js, favicon.svg), for NewSet.
func Shared() fs.FS {
	sub, err := fs.Sub(shared, "shared")
	if err != nil {
		panic(err)
	}
	return sub
}

// contentTypes is fixed rather than taken from package mime, whose answer depends on the
// host's mime tables; browsers refuse scripts served with the wrong type under
// X-Content-Type-Options: nosniff.
var contentTypes = map[string]string{
	".js":  "text/javascript; charset=utf-8",
	".css": "text/css; charset=utf-8",
	".svg": "image/svg+xml",
}

// assetCacheControl lets browsers keep assets for a year without asking: their URLs carry a
// content hash, so a new build is fetched under a new URL.
const assetCacheControl = "public, max-age=31536000, immutable"

type asset struct {
	contentType string
	body        []byte
	etag        string
	version     string // short content hash, appended to URLs to bust caches
}

// Set is a fixed set of files served below one directory path, e.g. "/graphiql/assets/".
type Set struct {
	dir   string
	files map[string]asset
}

// NewSet serves the .js, .css and .svg files at the root of each fsys below dir (an absolute
// path ending in "/"); other files (licences, notes) are not served. It panics on a bad dir, a
// read error or a name given twice: the files are embedded, so any of these is a programming
// error, and panicking at start-up makes every test catch it.
func NewSet(dir string, fsyses ...fs.FS) *Set {
	if !IsLocalPath(dir) || !strings.HasSuffix(dir, "/") {
		panic(fmt.Sprintf("webasset: directory %q is not an absolute path ending in /", dir))
	}
	s := &Set{dir: dir, files: map[string]asset{}}
	for _, fsys := range fsyses {
		entries, err := fs.ReadDir(fsys, ".")
		if err != nil {
			panic(fmt.Sprintf("webasset: %v", err))
		}
		for _, e := range entries {
			ct, ok := contentTypes[path.Ext(e.Name())]
			if e.IsDir() || !ok {
				continue
			}
			if _, dup := s.files[e.Name()]; dup {
				panic("webasset: two files named " + e.Name())
			}
			body, err := fs.ReadFile(fsys, e.Name())
			if err != nil {
				panic(fmt.Sprintf("webasset: %v", err))
			}
			sum := sha256.Sum256(body)
			s.files[e.Name()] = asset{
				contentType: ct,
				body:        body,
				etag:        `"` + hex.EncodeToString(sum[:16]) + `"`,
				version:     hex.EncodeToString(sum[:6]),
			}
		}
	}
	return s
}

// Favicon serves the icon the pages name, for the browsers and tools that ask for
// /favicon.ico whatever a page says (an unanswered one is an error in a browser's console).
func Favicon() http.Handler {
	body, err := fs.ReadFile(shared, "shared/favicon.svg")
	if err != nil {
		panic(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !AllowRead(w, r) {
			return
		}
		w.Header().Set("Content-Type", contentTypes[".svg"])
		w.Header().Set("Cache-Control", "public, max-age=86400")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
	})
}

// URL returns the versioned URL of the named file, for a page template.
func (s *Set) URL(name string) (string, error) {
	a, ok := s.files[name]
	if !ok {
		return "", fmt.Errorf("webasset: page references unknown asset %q", name)
	}
	return s.dir + name + "?v=" + a.version, nil
}

// Owns reports whether the request path lies in the set's directory.
func (s *Set) Owns(p string) bool { return strings.HasPrefix(p, s.dir) }

// ServeHTTP serves one file of the set, or 404 for a path that names none.
func (s *Set) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a, ok := s.files[strings.TrimPrefix(r.URL.Path, s.dir)]
	if !s.Owns(r.URL.Path) || !ok {
		http.NotFound(w, r)
		return
	}
	if !AllowRead(w, r) {
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Type", a.contentType)
	hdr.Set("Cache-Control", assetCacheControl)
	hdr.Set("ETag", a.etag)
	hdr.Set("X-Content-Type-Options", "nosniff")
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
}

// Page is an HTML page rendered once, at start-up.
type Page struct {
	body []byte
	etag string
}

// NewPage renders tmpl with data; the template may call {{asset "name"}} for the versioned URL
// of a file of set. It panics if rendering fails, which only a programming error can cause.
func NewPage(tmpl *template.Template, set *Set, data any) *Page {
	t := template.Must(tmpl.Clone()).Funcs(template.FuncMap{"asset": set.URL})
	var buf bytes.Buffer
	if err := t.Execute(&buf, data); err != nil {
		panic(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return &Page{body: buf.Bytes(), etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
}

// ParseTemplate parses a page template from fsys, with the asset function declared so that
// the template parses; NewPage binds it to a Set. It panics on a parse error, so that a broken
// embedded template fails every test and every start-up, not the first request.
func ParseTemplate(fsys fs.FS, name string) *template.Template {
	return template.Must(template.New(name).Funcs(template.FuncMap{
		"asset": func(string) (string, error) { return "", fmt.Errorf("webasset: asset is bound by NewPage") },
	}).ParseFS(fsys, name))
}

// ServeHTTP serves the page with headers that keep the browser on this origin.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !AllowRead(w, r) {
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	// The page names the current asset hashes, so it must be revalidated on every load for a
	// new build's assets to be picked up.
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("ETag", p.etag)
	hdr.Set("Content-Security-Policy", ContentSecurityPolicy(r.Host))
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(p.body))
}

// AllowRead answers 405 to anything but GET and HEAD, and reports whether the request may go on.
func AllowRead(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
	return false
}

// ContentSecurityPolicy keeps the browser on this origin. 'unsafe-inline' for styles only is
// what GraphiQL strictly needs: its dialogs (via react-remove-scroll) insert <style> elements
// at run time. Fonts and a few icons come as data: URLs inside graphiql.min.css. The explicit
// ws:/wss: sources are for subscriptions, since older browsers do not count WebSocket URLs as
// 'self'.
func ContentSecurityPolicy(host string) string {
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

// validHost admits only host[:port] characters, because the Host header is client-controlled
// and lands in a response header.
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

// IsLocalPath reports whether p is an absolute path on this origin; it rejects "//host" as
// well, which browsers read as another origin.
func IsLocalPath(p string) bool {
	return strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "//") && !strings.ContainsAny(p, "\\\x00\r\n")
}
