package webasset

import (
	"html/template"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"
)

func TestSetServesOnlyScriptsStylesAndImages(t *testing.T) {
	fsys := fstest.MapFS{
		"a.js":       {Data: []byte("var a;")},
		"b.css":      {Data: []byte("b{}")},
		"c.svg":      {Data: []byte("<svg/>")},
		"NOTES":      {Data: []byte("not served")},
		"sub/d.js":   {Data: []byte("not served either")},
		"e.html":     {Data: []byte("<p>")},
		"LICENSE.md": {Data: []byte("MIT")},
	}
	s := NewSet("/x/", fsys)
	tests := []struct {
		path, wantType string
		wantStatus     int
	}{
		{"/x/a.js", "text/javascript; charset=utf-8", http.StatusOK},
		{"/x/b.css", "text/css; charset=utf-8", http.StatusOK},
		{"/x/c.svg", "image/svg+xml", http.StatusOK},
		{"/x/NOTES", "", http.StatusNotFound},
		{"/x/sub/d.js", "", http.StatusNotFound},
		{"/x/e.html", "", http.StatusNotFound},
		{"/y/a.js", "", http.StatusNotFound},
	}
	for _, tt := range tests {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tt.path, nil))
		if rec.Code != tt.wantStatus {
			t.Errorf("GET %s = %d, want %d", tt.path, rec.Code, tt.wantStatus)
		}
		if tt.wantType != "" && rec.Header().Get("Content-Type") != tt.wantType {
			t.Errorf("GET %s: Content-Type %q, want %q", tt.path, rec.Header().Get("Content-Type"), tt.wantType)
		}
	}
}

// TestURLChangesWithContent: a file's URL carries a hash of its content, so a long cache
// never serves an old build.
func TestURLChangesWithContent(t *testing.T) {
	url := func(body string) string {
		u, err := NewSet("/x/", fstest.MapFS{"a.js": {Data: []byte(body)}}).URL("a.js")
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	one, two := url("var a = 1;"), url("var a = 2;")
	if !strings.HasPrefix(one, "/x/a.js?v=") || one == two {
		t.Errorf("URLs %q and %q, want /x/a.js?v=<hash> differing by content", one, two)
	}
	if _, err := NewSet("/x/", fstest.MapFS{}).URL("a.js"); err == nil {
		t.Error("URL of an unknown file did not fail")
	}
}

func TestNewSetPanicsOnProgrammingErrors(t *testing.T) {
	js := fstest.MapFS{"a.js": {Data: []byte("var a;")}}
	tests := map[string]func(){
		"relative dir":      func() { NewSet("x/", js) },
		"dir without slash": func() { NewSet("/x", js) },
		"other origin":      func() { NewSet("//host/x/", js) },
		"one name twice":    func() { NewSet("/x/", js, js) },
		"unknown page asset": func() {
			NewPage(template.Must(ParseTemplate(fstest.MapFS{"p": {Data: []byte(`{{asset "b.js"}}`)}}, "p").Clone()), NewSet("/x/", js), nil)
		},
	}
	for name, f := range tests {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("did not panic")
				}
			}()
			f()
		})
	}
}

// TestSharedHoldsTheWebSocketClient: both pages load gqlws.js from the shared files.
func TestSharedHoldsTheWebSocketClient(t *testing.T) {
	u, err := NewSet("/x/", Shared()).URL("gqlws.js")
	if err != nil || !strings.HasPrefix(u, "/x/gqlws.js?v=") {
		t.Errorf("URL(gqlws.js) = %q, %v", u, err)
	}
}
