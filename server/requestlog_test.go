package server

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/logtest"
)

// TestRequestLog: every request is one log line when it ends, with its id (the caller's
// when plain, else a new one, echoed in X-Request-Id), method, path, status, subject and
// operation; the audit record of a mutation carries the same id; a WebSocket is one line
// when it closes; probes are logged at debug level; no token is ever logged.
func TestRequestLog(t *testing.T) {
	rec := &logtest.Recorder{}
	a, s := wsServer(t, func(o *Options) { o.Logger = rec.Logger() })
	token := a.admin(t)

	tests := []struct {
		name         string
		path         string
		token        string
		givenID      string
		keepsID      bool
		query        string
		wantStatus   string
		wantSubject  string
		wantOp       string
		wantLevel    slog.Level
		wantAuditFor string
	}{
		{name: "query", path: "/graphql", token: token, query: `query Who { me { subject } }`,
			wantStatus: "200", wantSubject: "admin", wantOp: "query:Who", wantLevel: slog.LevelInfo},
		{name: "caller's id kept", path: "/graphql", token: token, givenID: "lb-7f3a.1_x", keepsID: true, query: `{ me { subject } }`,
			wantStatus: "200", wantSubject: "admin", wantOp: "query", wantLevel: slog.LevelInfo},
		{name: "unsafe id replaced", path: "/graphql", token: token, givenID: "a b\nforged=1", query: `{ me { subject } }`,
			wantStatus: "200", wantSubject: "admin", wantOp: "query", wantLevel: slog.LevelInfo},
		{name: "mutation is audited under the same id", path: "/graphql", token: token,
			query:      `mutation Make { createInstance(input: {organizationId: "acme", projectId: "web", networkId: "net-acme-web-eu", name: "logged", flavorId: "g1.small", imageId: "ubuntu-24.04"}) { userErrors { code } } }`,
			wantStatus: "200", wantSubject: "admin", wantOp: "mutation:Make", wantLevel: slog.LevelInfo, wantAuditFor: "createInstance"},
		{name: "unauthenticated", path: "/graphql", query: `{ me { subject } }`,
			wantStatus: "401", wantLevel: slog.LevelInfo},
		{name: "probe", path: "/healthz", wantStatus: "200", wantLevel: slog.LevelDebug},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var req *http.Request
			if tt.query != "" {
				req = postRequest(t, tt.query, nil)
			} else {
				req = httptest.NewRequest(http.MethodGet, tt.path, nil)
			}
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			if tt.givenID != "" {
				req.Header.Set(requestIDHeader, tt.givenID)
			}
			mark := rec.Mark()
			res := a.serve(req)
			id := res.Header().Get(requestIDHeader)
			if id == "" || (id == tt.givenID) != tt.keepsID {
				t.Errorf("X-Request-Id %q for a request that gave %q", id, tt.givenID)
			}
			lines := rec.Since(mark, "request")
			if len(lines) != 1 {
				t.Fatalf("%d request lines, want 1", len(lines))
			}
			got := lines[0]
			want := map[string]string{"method": req.Method, "path": tt.path, "status": tt.wantStatus,
				"subject": tt.wantSubject, "operation": tt.wantOp, "request_id": id}
			for k, v := range want {
				if got.Attrs[k] != v {
					t.Errorf("%s = %q, want %q (line %v)", k, got.Attrs[k], v, got.Attrs)
				}
			}
			if got.Level != tt.wantLevel {
				t.Errorf("logged at %v, want %v", got.Level, tt.wantLevel)
			}
			if tt.wantAuditFor != "" {
				audits := rec.Since(mark, "audit")
				if len(audits) != 1 || audits[0].Attrs["request_id"] != id || audits[0].Attrs["mutation"] != tt.wantAuditFor {
					t.Errorf("audit records %v, want one of %s with request_id %s", audits, tt.wantAuditFor, id)
				}
			}
		})
	}

	t.Run("websocket", func(t *testing.T) {
		mark := rec.Mark()
		c := mustDialWS(t, wsURL(s), protoTransportWS, wsDial{})
		c.mustAck(token)
		c.conn.Close()
		eventually.Holds(t, 5*time.Second, func() bool { return len(rec.Since(mark, "request")) == 1 },
			"no request line after the socket closed")
		got := rec.Since(mark, "request")[0].Attrs
		if got["status"] != "101" || got["subject"] != "admin" || got["path"] != "/graphql" {
			t.Errorf("socket logged as %v", got)
		}
	})

	for _, r := range rec.Since(0, "") {
		t.Errorf("a record without a message: %v", r)
	}
	for _, msg := range []string{"request", "audit"} {
		for _, r := range rec.Since(0, msg) {
			for k, v := range r.Attrs {
				if strings.Contains(v, token) {
					t.Errorf("%s record logged the token in %s", msg, k)
				}
			}
		}
	}
}
