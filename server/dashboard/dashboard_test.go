package dashboard

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func serve(h http.Handler, method, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec
}

var refRE = regexp.MustCompile(`\b(?:src|href)="([^"]*)"`)

// TestPageNamesItsEndpointsAndOnlyLocalAssets: the page tells its script the GraphQL path,
// links to GraphiQL, and references only versioned files below AssetsDir, each of which is
// served with its type and a long cache lifetime.
func TestPageNamesItsEndpointsAndOnlyLocalAssets(t *testing.T) {
	h := Handler("/graphql", "/graphiql")
	rec := serve(h, http.MethodGet, "/")
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("GET / = %d %q, want 200 text/html", rec.Code, rec.Header().Get("Content-Type"))
	}
	page := rec.Body.String()
	if !strings.Contains(page, `data-endpoint="/graphql"`) {
		t.Error("page does not name the GraphQL endpoint")
	}
	var scripts []string
	for _, m := range refRE.FindAllStringSubmatch(page, -1) {
		ref := strings.ReplaceAll(m[1], "&amp;", "&")
		if ref == "/graphiql" {
			continue
		}
		if !strings.HasPrefix(ref, AssetsDir) || !strings.Contains(ref, "?v=") {
			t.Errorf("reference %q is not a versioned file below %s", ref, AssetsDir)
			continue
		}
		if strings.Contains(ref, ".js?") {
			scripts = append(scripts, ref)
		}
		a := serve(h, http.MethodGet, ref)
		if a.Code != http.StatusOK || a.Body.Len() == 0 {
			t.Errorf("GET %s = %d with %d bytes", ref, a.Code, a.Body.Len())
		}
		if cc := a.Header().Get("Cache-Control"); !strings.Contains(cc, "immutable") {
			t.Errorf("GET %s: Cache-Control %q", ref, cc)
		}
	}
	// The shared WebSocket client and the terminal must load before the script that uses them.
	if len(scripts) != 3 || !strings.Contains(scripts[0], "/gqlws.js?") || !strings.Contains(scripts[1], "/xterm.js?") || !strings.Contains(scripts[2], "/app.js?") {
		t.Errorf("scripts %v, want gqlws.js, xterm.js, then app.js", scripts)
	}
}

func TestPageHeaders(t *testing.T) {
	rec := serve(Handler("/graphql", "/graphiql"), http.MethodGet, "/")
	for header, want := range map[string]string{
		"Content-Security-Policy": "script-src 'self'",
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
		"Cache-Control":           "no-cache",
	} {
		if got := rec.Header().Get(header); !strings.Contains(got, want) {
			t.Errorf("%s = %q, want it to contain %q", header, got, want)
		}
	}
}

func TestStatusOfOtherRequests(t *testing.T) {
	h := Handler("/graphql", "/graphiql")
	tests := []struct {
		method, path string
		want         int
	}{
		{http.MethodHead, "/", http.StatusOK},
		{http.MethodPost, "/", http.StatusMethodNotAllowed},
		{http.MethodPost, AssetsDir + "app.js", http.StatusMethodNotAllowed},
		{http.MethodGet, AssetsDir + "nope.js", http.StatusNotFound},
		{http.MethodGet, AssetsDir, http.StatusNotFound},
		{http.MethodGet, AssetsDir + "../page.html.tmpl", http.StatusNotFound},
	}
	for _, tt := range tests {
		if rec := serve(h, tt.method, tt.path); rec.Code != tt.want {
			t.Errorf("%s %s = %d, want %d", tt.method, tt.path, rec.Code, tt.want)
		}
	}
}

func TestHandlerRefusesOtherOrigins(t *testing.T) {
	for _, tc := range []struct{ endpoint, graphiql string }{
		{"https://example.com/graphql", "/graphiql"},
		{"//example.com/graphql", "/graphiql"},
		{"/graphql", "graphiql"},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Handler(%q, %q) did not panic", tc.endpoint, tc.graphiql)
				}
			}()
			Handler(tc.endpoint, tc.graphiql)
		}()
	}
}
