package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/feed"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/logtest"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/store"
)

// runningForConsole serves an API whose workers realise instances, and makes one RUNNING
// instance of acme/web; it returns the API, its server and the instance's id.
func runningForConsole(t *testing.T, name string, mutate ...func(*Options)) (*api, *httptest.Server, string) {
	t.Helper()
	a, s := wsServer(t, mutate...)
	a.realise(t)
	c := subscribeWS(t, s, protoTransportWS, a.admin(t), verbSubQuery)
	id := a.mustCreate(t, a.admin(t), createInput(name)).ID
	c.await(power(id, "RUNNING", "RUNNING"))
	return a, s, id
}

// consoleURL opens a console session of the instance as the token's holder and returns its
// URL, which names the host the request reached (httptest's example.com).
func consoleURL(t *testing.T, a *api, token, id string, header ...string) string {
	t.Helper()
	req := postRequest(t, consoleDoc, map[string]any{"id": id})
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res := a.send(t, token, req)
	var p struct {
		ConsoleSession *struct {
			URL string `json:"url"`
		} `json:"consoleSession"`
	}
	decode(t, res.Data["createConsoleSession"], &p)
	if p.ConsoleSession == nil {
		t.Fatalf("createConsoleSession: %s", res.Raw)
	}
	return p.ConsoleSession.URL
}

// dialConsole opens a console URL on the test server s (whatever host the URL names).
func dialConsole(t *testing.T, s *httptest.Server, consoleURL string, header http.Header) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	u, err := url.Parse(consoleURL)
	if err != nil {
		t.Fatalf("console URL %q: %v", consoleURL, err)
	}
	u.Host = strings.TrimPrefix(s.URL, "http://")
	conn, res, err := (&websocket.Dialer{HandshakeTimeout: 5 * time.Second}).Dial(u.String(), header)
	if err == nil {
		t.Cleanup(func() { conn.Close() })
	}
	return conn, res, err
}

func mustDialConsole(t *testing.T, s *httptest.Server, consoleURL string) *websocket.Conn {
	t.Helper()
	conn, res, err := dialConsole(t, s, consoleURL, nil)
	if err != nil {
		t.Fatalf("open console %s: %v (%s)", consoleURL, err, refusalOf(res))
	}
	return conn
}

// refusalOf describes a refused handshake: its status and error code.
func refusalOf(res *http.Response) string {
	if res == nil {
		return "no response"
	}
	body, _ := io.ReadAll(res.Body)
	return res.Status + " " + string(body)
}

// wantRefusedConsole dials the console URL and wants the handshake refused with the status
// and the error code.
func wantRefusedConsole(t *testing.T, s *httptest.Server, consoleURL string, header http.Header, status int, code string) {
	t.Helper()
	_, res, err := dialConsole(t, s, consoleURL, header)
	if err == nil {
		t.Fatalf("console %s opened, want %d %s", consoleURL, status, code)
	}
	if res == nil {
		t.Fatalf("console %s: %v, want %d %s", consoleURL, err, status, code)
	}
	var body struct {
		Errors []struct {
			Extensions struct {
				Code string `json:"code"`
			} `json:"extensions"`
		} `json:"errors"`
	}
	json.NewDecoder(res.Body).Decode(&body)
	if res.StatusCode != status || len(body.Errors) != 1 || body.Errors[0].Extensions.Code != code {
		t.Errorf("console %s: %d %+v, want %d %s", consoleURL, res.StatusCode, body, status, code)
	}
}

// readConsoleUntil reads the console's messages until what it showed contains want.
func readConsoleUntil(t *testing.T, conn *websocket.Conn, want string) string {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(verbLimit))
	var seen []byte
	for !strings.Contains(string(seen), want) {
		kind, msg, err := conn.ReadMessage()
		if err != nil {
			t.Fatalf("console: %v, having shown %q, want %q", err, seen, want)
		}
		if kind != websocket.BinaryMessage {
			t.Errorf("console message of type %d, want binary", kind)
		}
		seen = append(seen, msg...)
	}
	return string(seen)
}

// consoleClosed reads until the server closes the console and returns its close frame.
func consoleClosed(t *testing.T, conn *websocket.Conn) *websocket.CloseError {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(verbLimit))
	for {
		if _, _, err := conn.ReadMessage(); err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) {
				t.Fatalf("the console ended with %v, want a close frame", err)
			}
			return ce
		}
	}
}

// TestConsoleSession: an operator's session URL is a ws:// URL on the host the request
// reached (wss:// behind TLS or a proxy that says so, the configured public URL when there is
// one); opening it shows the end of the boot log, then echoes what is typed; the ACTION
// CONSOLE event names the operator; the URL works once.
func TestConsoleSession(t *testing.T) {
	a, s, id := runningForConsole(t, "console")
	op := a.operator(t)
	link := consoleURL(t, a, op, id)
	if !strings.HasPrefix(link, "ws://example.com/console/") {
		t.Errorf("console URL %q, want ws:// on the request's host", link)
	}
	if u := consoleURL(t, a, op, id, "X-Forwarded-Proto", "https"); !strings.HasPrefix(u, "wss://example.com/console/") {
		t.Errorf("console URL behind a TLS proxy %q, want wss://", u)
	}
	history := a.mustPost(t, op, `query($id: ID!) { instanceEvents(id: $id, first: 100) { edges { node { kind action actor } } } }`, map[string]any{"id": id})
	if raw := string(history.Raw); !strings.Contains(raw, `"action":"CONSOLE","actor":"olga"`) {
		t.Errorf("history %s, want an ACTION CONSOLE by olga", raw)
	}

	conn := mustDialConsole(t, s, link)
	readConsoleUntil(t, conn, "console login: ")
	if err := conn.WriteMessage(websocket.TextMessage, []byte("root\r")); err != nil {
		t.Fatal(err)
	}
	readConsoleUntil(t, conn, "root\r\n")
	conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	if ce := consoleClosed(t, conn); ce.Code != websocket.CloseNormalClosure {
		t.Errorf("closing the console answered %d, want 1000", ce.Code)
	}
	wantRefusedConsole(t, s, link, nil, http.StatusUnauthorized, "UNAUTHENTICATED")

	t.Run("public URL", func(t *testing.T) {
		b := apiOn(t, a.rdb, feed.Options{}, func(o *Options) { o.PublicURL = "https://api.example.net:8443/ignored/path" })
		if u := consoleURL(t, b, op, id); !strings.HasPrefix(u, "wss://api.example.net:8443/console/") {
			t.Errorf("console URL %q, want wss:// on the public URL's host", u)
		}
		for _, bad := range []string{"api.example.net", "ftp://api.example.net", "https://"} {
			if _, err := newPublicURL(bad); err == nil {
				t.Errorf("public URL %q accepted", bad)
			}
		}
	})
}

// handlerService is a service on the API's Redis and region, for handlers built beside it.
func (a *api) handlerService(t *testing.T, now ...func() time.Time) *instance.Service {
	t.Helper()
	q, err := queue.New(a.rdb, queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o := instance.Options{Catalog: region.Demo(), Store: store.New(a.rdb), Queue: q, Region: a.region, Logger: slog.New(slog.DiscardHandler)}
	if len(now) > 0 {
		o.Now = now[0]
	}
	svc, err := instance.NewService(o)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// TestConsoleSessionRefusals: what is not a console session's handshake is refused with its
// code, and a refused handshake leaves the session usable.
func TestConsoleSessionRefusals(t *testing.T) {
	rec := &logtest.Recorder{}
	a, s, id := runningForConsole(t, "console-refused", func(o *Options) { o.Logger = rec.Logger() })
	op := a.operator(t)
	link := consoleURL(t, a, op, id)
	token := link[strings.LastIndex(link, "/")+1:]
	u, _ := url.Parse(link)
	u.Scheme, u.Host = "http", strings.TrimPrefix(s.URL, "http://")
	res, err := http.Get(u.String())
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUpgradeRequired || res.Header.Get("Upgrade") != "websocket" {
		t.Errorf("a plain GET of the console: %d (Upgrade %q), want 426 naming websocket", res.StatusCode, res.Header.Get("Upgrade"))
	}
	wantRefusedConsole(t, s, "ws://x/console/not-a-token", nil, http.StatusUnauthorized, "UNAUTHENTICATED")
	wantRefusedConsole(t, s, link, http.Header{"Origin": {"https://evil.example"}}, http.StatusForbidden, "FORBIDDEN")
	// A handshake the upgrade would refuse (no key) is refused before the session is used.
	bad, _ := http.NewRequest(http.MethodGet, u.String(), nil)
	bad.Header.Set("Connection", "Upgrade")
	bad.Header.Set("Upgrade", "websocket")
	bad.Header.Set("Sec-WebSocket-Version", "13")
	res, err = http.DefaultClient.Do(bad)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("a handshake without a key: %d, want 400", res.StatusCode)
	}
	// None of those used the session.
	conn := mustDialConsole(t, s, link)
	readConsoleUntil(t, conn, "login: ")
	// The token, a credential, is in no log line.
	for _, r := range rec.Since(0, "request") {
		for k, v := range r.Attrs {
			if strings.Contains(v, token) {
				t.Errorf("the request log's %s %q holds the console token", k, v)
			}
		}
	}

	t.Run("a message too big", func(t *testing.T) {
		conn := mustDialConsole(t, s, consoleURL(t, a, op, id))
		conn.WriteMessage(websocket.BinaryMessage, make([]byte, consoleMessageMax+1))
		if ce := consoleClosed(t, conn); ce.Code != websocket.CloseMessageTooBig {
			t.Errorf("a %d-byte message closed the console with %d, want 1009", consoleMessageMax+1, ce.Code)
		}
	})
	t.Run("an instance stopped since", func(t *testing.T) {
		link := consoleURL(t, a, op, id)
		a.mustPower(t, op, stopDoc, "stopInstance", map[string]any{"id": id})
		eventually.Holds(t, verbLimit, func() bool {
			srv, err := a.region.FindServers(t.Context(), region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: "eu-west", NetworkID: "net-acme-web-eu"}, region.InstanceTag, id)
			return err == nil && len(srv) == 1 && srv[0].State == region.ServerStopped
		}, "the server stopped")
		wantRefusedConsole(t, s, link, nil, http.StatusConflict, "UNPROCESSABLE")
	})
}

// TestConsoleSessionLimits: consoles are bounded per principal and per process; one past a
// bound is refused with 429 and RATE_LIMITED, counted by the limit, and its session given
// back, so that its URL opens once a console closes.
func TestConsoleSessionLimits(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, s, id := runningForConsole(t, "console-limits", func(o *Options) { o.Registry, o.MaxConsoles, o.MaxConsolesPerPrincipal = reg, 2, 1 })
	olga, otto, oona := a.operator(t), a.token(t, "otto", auth.Grant{OrganizationID: "acme", Role: auth.RoleOperator}),
		a.token(t, "oona", auth.Grant{OrganizationID: "acme", Role: auth.RoleOperator})
	first := mustDialConsole(t, s, consoleURL(t, a, olga, id))
	second := consoleURL(t, a, olga, id)
	wantRefusedConsole(t, s, second, nil, http.StatusTooManyRequests, "RATE_LIMITED")
	mustDialConsole(t, s, consoleURL(t, a, otto, id))
	wantRefusedConsole(t, s, consoleURL(t, a, oona, id), nil, http.StatusTooManyRequests, "RATE_LIMITED")
	for _, limit := range []string{limitPrincipalConsoles, limitProcessConsoles} {
		if n := refusals(t, reg, limit); n != 1 {
			t.Errorf("%v refusals by %s, want 1", n, limit)
		}
	}

	first.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	consoleClosed(t, first)
	// The server lets go of the console just after it answered the close.
	var conn *websocket.Conn
	eventually.Holds(t, verbLimit, func() bool {
		c, _, err := dialConsole(t, s, second, nil)
		conn = c
		return err == nil
	}, "the refused session opens once olga's first console closed")
	readConsoleUntil(t, conn, "login: ")
}

// TestConsoleSessionExpires: a console is closed when its session expires, and a session
// past its expiry does not open.
func TestConsoleSessionExpires(t *testing.T) {
	a, s, id := runningForConsole(t, "console-expiry")
	// API processes on the same Redis and region whose clocks are behind: sessions they open
	// expire two seconds from now, or expired a minute ago.
	behind := func(by time.Duration) *api {
		svc := a.handlerService(t, func() time.Time { return time.Now().Add(-by) })
		h, err := New(Options{Service: svc, Feed: a.feed, Keys: a.keys, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return &api{handler: h, keys: a.keys}
	}
	op := a.operator(t)
	conn := mustDialConsole(t, s, consoleURL(t, behind(instance.ConsoleTTL-2*time.Second), op, id))
	readConsoleUntil(t, conn, "login: ")
	if ce := consoleClosed(t, conn); ce.Code != websocket.CloseNormalClosure || !strings.Contains(ce.Text, "expired") {
		t.Errorf("the console closed with %d %q, want 1000 saying it expired", ce.Code, ce.Text)
	}
	wantRefusedConsole(t, s, consoleURL(t, behind(instance.ConsoleTTL+time.Minute), op, id), nil, http.StatusUnauthorized, "UNAUTHENTICATED")

	// A session ends no later than the token of the principal who made it.
	short, err := a.keys.Mint(auth.Principal{Subject: "olga", Grants: []auth.Grant{{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleOperator}}}, time.Now(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	res := a.mustPost(t, short, consoleDoc, map[string]any{"id": id})
	var p struct {
		ConsoleSession struct {
			ExpiresAt time.Time `json:"expiresAt"`
		} `json:"consoleSession"`
	}
	decode(t, res.Data["createConsoleSession"], &p)
	if limit := time.Now().Add(instance.ConsoleTTL / 2); !p.ConsoleSession.ExpiresAt.Before(limit) {
		t.Errorf("a session made with a token good for a minute expires at %s, want before %s", p.ConsoleSession.ExpiresAt, limit)
	}
}

// TestConsoleSessionShutdown: a server shutting down closes its consoles with 1001.
func TestConsoleSessionShutdown(t *testing.T) {
	ctx, shutdown := context.WithCancel(context.Background())
	defer shutdown()
	a, s, id := runningForConsole(t, "console-shutdown", func(o *Options) { o.Context = ctx })
	conn := mustDialConsole(t, s, consoleURL(t, a, a.operator(t), id))
	readConsoleUntil(t, conn, "login: ")
	shutdown()
	if ce := consoleClosed(t, conn); ce.Code != websocket.CloseGoingAway {
		t.Errorf("shutting down closed the console with %d, want 1001", ce.Code)
	}
}

// TestInputPace: typing is paced to a rate beyond a burst of one message.
func TestInputPace(t *testing.T) {
	p := newInputPace(1000, 500)
	start := time.Unix(0, 0)
	steps := []struct {
		n     int
		after time.Duration
		want  time.Duration
	}{
		{n: 500, want: 0},                                // the burst
		{n: 100, want: 100 * time.Millisecond},           // 100 bytes at 1,000/s
		{n: 100, after: 200 * time.Millisecond, want: 0}, // the wait paid, 100 more came in
		{n: 300, after: 0, want: 300 * time.Millisecond}, // nothing left: wait for all of it
		{n: 0, after: 2 * time.Second, want: 0},          // refilled, to the burst only
		{n: 600, after: 0, want: 100 * time.Millisecond}, // one past the burst
	}
	now := start
	for i, st := range steps {
		now = now.Add(st.after)
		if got := p.wait(st.n, now); got != st.want {
			t.Errorf("step %d: %d bytes wait %s, want %s", i, st.n, got, st.want)
		}
	}
}
