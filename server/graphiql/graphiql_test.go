package graphiql

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

const (
	testPrefix   = "/graphiql"
	testEndpoint = "/graphql"
)

func newServer(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	h := Handler(testPrefix, testEndpoint)
	mux.Handle(testPrefix, h)
	mux.Handle(testPrefix+"/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string, header http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

var refRE = regexp.MustCompile(`\b(?:src|href)="([^"]*)"`)

// references returns every src and href value in the page, unescaped as a
// browser would see them.
func references(page string) []string {
	var refs []string
	for _, m := range refRE.FindAllStringSubmatch(page, -1) {
		refs = append(refs, strings.ReplaceAll(m[1], "&amp;", "&"))
	}
	return refs
}

func TestPageServedAtPrefixAndSlash(t *testing.T) {
	srv := newServer(t)
	for _, p := range []string{testPrefix, testPrefix + "/"} {
		t.Run(p, func(t *testing.T) {
			resp, body := get(t, srv.URL+p, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200", resp.StatusCode)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
				t.Errorf("Content-Type %q, want text/html", ct)
			}
			if cc := resp.Header.Get("Cache-Control"); cc != "no-cache" {
				t.Errorf("Cache-Control %q, want no-cache", cc)
			}
			if !strings.Contains(body, `data-endpoint="`+testEndpoint+`"`) {
				t.Errorf("page does not name endpoint %q", testEndpoint)
			}
			for _, bad := range []string{"http://", "https://", "//cdn"} {
				if strings.Contains(body, bad) {
					t.Errorf("page contains %q: an air-gapped browser cannot reach it", bad)
				}
			}
			refs := references(body)
			if len(refs) < 7 {
				t.Fatalf("found %d src/href references, want the 2 stylesheets and 5 scripts: %v", len(refs), refs)
			}
			for _, ref := range refs {
				if !strings.HasPrefix(ref, testPrefix+"/") {
					t.Errorf("reference %q is not under %s/", ref, testPrefix)
				}
			}
		})
	}
}

func TestPageContentSecurityPolicy(t *testing.T) {
	srv := newServer(t)
	resp, _ := get(t, srv.URL+testPrefix, nil)
	csp := resp.Header.Get("Content-Security-Policy")
	if csp == "" {
		t.Fatal("no Content-Security-Policy header")
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, want := range []string{
		"default-src 'none'",
		"script-src 'self'",
		"connect-src 'self' ws://" + host + " wss://" + host,
		"frame-ancestors 'none'",
	} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	// Any http(s) source would let the browser try an outside host.
	if strings.Contains(csp, "http") || strings.Contains(csp, "*") {
		t.Errorf("CSP %q admits other origins", csp)
	}
	if strings.Contains(csp, "unsafe-eval") {
		t.Errorf("CSP %q allows eval", csp)
	}
	for _, d := range strings.Split(csp, ";") {
		if strings.HasPrefix(strings.TrimSpace(d), "script-src") && strings.Contains(d, "unsafe-inline") {
			t.Errorf("CSP allows inline scripts: %q", d)
		}
	}
}

func TestCSPIgnoresHostileHost(t *testing.T) {
	h := Handler(testPrefix, testEndpoint)
	req := httptest.NewRequest(http.MethodGet, testPrefix, nil)
	req.Host = "evil.example; script-src *"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	csp := rec.Header().Get("Content-Security-Policy")
	if strings.Contains(csp, "evil") || strings.Contains(csp, "*") {
		t.Errorf("Host header leaked into CSP: %q", csp)
	}
	if !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("CSP %q lacks connect-src 'self'", csp)
	}
}

func TestReferencedAssetsServed(t *testing.T) {
	srv := newServer(t)
	_, page := get(t, srv.URL+testPrefix, nil)
	wantType := map[string]string{
		".js":  "text/javascript; charset=utf-8",
		".css": "text/css; charset=utf-8",
		".svg": "image/svg+xml",
	}
	for _, ref := range references(page) {
		t.Run(ref, func(t *testing.T) {
			resp, body := get(t, srv.URL+ref, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200", resp.StatusCode)
			}
			name := strings.SplitN(ref, "?", 2)[0]
			ext := name[strings.LastIndex(name, "."):]
			if ct := resp.Header.Get("Content-Type"); ct != wantType[ext] {
				t.Errorf("Content-Type %q, want %q", ct, wantType[ext])
			}
			if body == "" {
				t.Error("empty body")
			}
			if cc := resp.Header.Get("Cache-Control"); !strings.Contains(cc, "max-age=31536000") {
				t.Errorf("Cache-Control %q, want a long max-age", cc)
			}
			if !strings.Contains(ref, "?v=") {
				t.Errorf("reference %q carries no version, so a long cache would serve stale files", ref)
			}

			etag := resp.Header.Get("ETag")
			if etag == "" {
				t.Fatal("no ETag")
			}
			resp, _ = get(t, srv.URL+ref, http.Header{"If-None-Match": {etag}})
			if resp.StatusCode != http.StatusNotModified {
				t.Errorf("revalidation status %d, want 304", resp.StatusCode)
			}
		})
	}
}

func TestNotFound(t *testing.T) {
	srv := newServer(t)
	for _, p := range []string{
		testPrefix + "/assets/nope.js",
		testPrefix + "/assets/VERSIONS",
		testPrefix + "/assets/",
		testPrefix + "/assets/../page.html.tmpl",
		testPrefix + "/other",
	} {
		resp, _ := get(t, srv.URL+p, nil)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: status %d, want 404", p, resp.StatusCode)
		}
	}
}

func TestMethodNotAllowed(t *testing.T) {
	h := Handler(testPrefix, testEndpoint)
	for _, p := range []string{testPrefix, testPrefix + "/assets/page.js"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, p, nil))
		if rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("POST %s: status %d, want 405", p, rec.Code)
		}
		if allow := rec.Header().Get("Allow"); allow != "GET, HEAD" {
			t.Errorf("POST %s: Allow %q", p, allow)
		}
	}
}

func TestEndpointIsEscaped(t *testing.T) {
	endpoint := `/graphql?a="><script>alert(1)</script>`
	rec := httptest.NewRecorder()
	Handler(testPrefix, endpoint).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, testPrefix, nil))
	body := rec.Body.String()
	if strings.Contains(body, "<script>alert") || strings.Contains(body, endpoint) {
		t.Errorf("endpoint injected unescaped:\n%s", body)
	}
}

func TestHandlerRejectsOtherOrigins(t *testing.T) {
	for _, tc := range []struct{ prefix, endpoint string }{
		{testPrefix, "https://example.com/graphql"},
		{testPrefix, "//example.com/graphql"},
		{testPrefix, "graphql"},
		{"graphiql", testEndpoint},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Handler(%q, %q) did not panic", tc.prefix, tc.endpoint)
				}
			}()
			Handler(tc.prefix, tc.endpoint)
		}()
	}
}

func TestPrefixTrailingSlash(t *testing.T) {
	h := Handler(testPrefix+"/", testEndpoint)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, testPrefix, nil))
	if rec.Code != http.StatusOK {
		t.Errorf("status %d, want 200", rec.Code)
	}
	if strings.Contains(rec.Body.String(), testPrefix+"//") {
		t.Error("asset URLs contain a doubled slash")
	}
}
