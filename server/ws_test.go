package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/metrictest"
)

// The two GraphQL WebSocket protocols: graphql-transport-ws (the graphql-ws npm client) and
// the legacy graphql-ws (subscriptions-transport-ws).
const (
	protoTransportWS = "graphql-transport-ws"
	protoLegacyWS    = "graphql-ws"
)

var wsProtocols = []string{protoTransportWS, protoLegacyWS}

// wsMessage is a message of either protocol.
type wsMessage struct {
	Type    string          `json:"type"`
	ID      string          `json:"id,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// wsClient is a gorilla WebSocket client whose reader runs in the background: it answers ping
// frames (gorilla's default handler, unless silent) and graphql-transport-ws "ping" messages,
// and queues every other message.
type wsClient struct {
	tb     testing.TB
	proto  string
	silent bool
	conn   *websocket.Conn

	writeMu sync.Mutex
	msgs    chan wsMessage
	done    chan struct{}
	quit    chan struct{} // closed when the test stops reading: the reader drops what comes
	err     error         // what ended the reader; set before done closes

	pingFrames atomic.Int32 // WebSocket ping frames received
	pingMsgs   atomic.Int32 // graphql-transport-ws "ping" messages received
	kaMsgs     atomic.Int32 // graphql-ws "ka" messages received
}

type wsDial struct {
	header http.Header
	// silent: answer neither ping frames nor "ping" messages, as a peer that vanished.
	silent bool
}

// wsURL is the /graphql WebSocket address of a test server.
func wsURL(s *httptest.Server) string { return "ws" + strings.TrimPrefix(s.URL, "http") + "/graphql" }

// dialWS opens a WebSocket speaking proto; a refused handshake returns the response.
func dialWS(tb testing.TB, url, proto string, opt wsDial) (*wsClient, *http.Response, error) {
	tb.Helper()
	d := websocket.Dialer{Subprotocols: []string{proto}, HandshakeTimeout: 5 * time.Second}
	conn, res, err := d.Dial(url, opt.header)
	if err != nil {
		return nil, res, err
	}
	tb.Cleanup(func() { conn.Close() })
	if got := conn.Subprotocol(); got != proto {
		tb.Fatalf("negotiated subprotocol %q, want %q", got, proto)
	}
	c := &wsClient{tb: tb, proto: proto, silent: opt.silent, conn: conn, msgs: make(chan wsMessage, 256), done: make(chan struct{}), quit: make(chan struct{})}
	ponger := conn.PingHandler()
	conn.SetPingHandler(func(data string) error {
		c.pingFrames.Add(1)
		if opt.silent {
			return nil
		}
		c.writeMu.Lock()
		defer c.writeMu.Unlock()
		return ponger(data)
	})
	go c.read()
	return c, res, nil
}

func mustDialWS(tb testing.TB, url, proto string, opt wsDial) *wsClient {
	tb.Helper()
	c, res, err := dialWS(tb, url, proto, opt)
	if err != nil {
		status := 0
		if res != nil {
			status = res.StatusCode
		}
		tb.Fatalf("dial %s: %v (HTTP %d)", proto, err, status)
	}
	return c
}

func (c *wsClient) read() {
	defer close(c.done)
	for {
		_, data, err := c.conn.ReadMessage()
		if err != nil {
			c.err = err
			return
		}
		var m wsMessage
		if err := json.Unmarshal(data, &m); err != nil {
			c.err = fmt.Errorf("message is not JSON: %s", data)
			return
		}
		switch m.Type {
		case "ping":
			c.pingMsgs.Add(1)
			if c.proto == protoTransportWS && !c.silent {
				c.write(map[string]any{"type": "pong"}) // an error: the socket is closing, which the reader sees next
			}
			continue
		case "ka":
			c.kaMsgs.Add(1)
			continue
		}
		select {
		case c.msgs <- m:
		case <-c.quit:
		}
	}
}

func (c *wsClient) write(v any) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return c.conn.WriteJSON(v)
}

// send writes a message from the test's goroutine.
func (c *wsClient) send(v any) {
	c.tb.Helper()
	if err := c.write(v); err != nil {
		c.tb.Errorf("write: %v", err)
	}
}

// init sends connection_init with the payload, or without one when payload is nil.
func (c *wsClient) init(payload any) {
	m := map[string]any{"type": "connection_init"}
	if payload != nil {
		m["payload"] = payload
	}
	c.send(m)
}

// mustAck sends connection_init with a bearer token and waits for connection_ack.
func (c *wsClient) mustAck(token string) {
	c.tb.Helper()
	c.init(map[string]any{"Authorization": "Bearer " + token})
	if m := c.next(); m.Type != "connection_ack" {
		c.tb.Fatalf("after connection_init: %+v, want connection_ack", m)
	}
}

// start starts an operation: "subscribe" in graphql-transport-ws, "start" in graphql-ws.
func (c *wsClient) start(id, query string) {
	t := "subscribe"
	if c.proto == protoLegacyWS {
		t = "start"
	}
	c.send(map[string]any{"type": t, "id": id, "payload": map[string]any{"query": query}})
}

// dataType is the type of a result message: "next" in graphql-transport-ws, "data" in graphql-ws.
func (c *wsClient) dataType() string {
	if c.proto == protoLegacyWS {
		return "data"
	}
	return "next"
}

// next returns the next queued message, failing the test when none comes or the socket closes.
// It waits as long as any wait for the workers and the region (verbLimit): a message may be
// the change a worker makes, slow under -race beside other packages' tests.
func (c *wsClient) next() wsMessage {
	c.tb.Helper()
	select {
	case m := <-c.msgs:
		return m
	case <-c.done:
		c.tb.Fatalf("socket closed while waiting for a message: %v", c.err)
	case <-time.After(verbLimit):
		c.tb.Fatalf("no message within %s", verbLimit)
	}
	return wsMessage{}
}

// closed waits for the socket to close and returns what the client read last: a
// *websocket.CloseError for a close frame. Messages still queued are returned too.
func (c *wsClient) closed(within time.Duration) ([]wsMessage, error) {
	c.tb.Helper()
	select {
	case <-c.done:
	case <-time.After(within):
		c.tb.Fatalf("socket still open after %v", within)
	}
	var msgs []wsMessage
	for {
		select {
		case m := <-c.msgs:
			msgs = append(msgs, m)
		default:
			return msgs, c.err
		}
	}
}

// wantClose checks that the socket closed with the close code and reason.
func wantClose(tb testing.TB, err error, code int, reason string) {
	tb.Helper()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) {
		tb.Fatalf("socket ended with %v, want close frame %d", err, code)
	}
	if ce.Code != code || (reason != "" && ce.Text != reason) {
		tb.Errorf("close %d %q, want %d %q", ce.Code, ce.Text, code, reason)
	}
}

// wsServer serves the API over a real listener.
func wsServer(tb testing.TB, mutate ...func(*Options)) (*api, *httptest.Server) {
	tb.Helper()
	a := newAPI(tb, mutate...)
	return a, serveAPI(tb, a)
}

// TestWebSocketAuth: connection_init authenticates; no token closes with 4401, a bad one with
// 4403, in both protocols, and on graphql-ws a connection_error says why first.
func TestWebSocketAuth(t *testing.T) {
	a, s := wsServer(t)
	good := a.admin(t)
	other, err := auth.NewKeys([]byte("another-secret-another-secret-an"))
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.Mint(auth.Principal{Subject: "admin", Grants: []auth.Grant{{OrganizationID: "acme", Role: auth.RoleAdmin}}}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	expired, err := a.keys.Mint(auth.Principal{Subject: "admin", Grants: []auth.Grant{{OrganizationID: "acme", Role: auth.RoleAdmin}}}, time.Now().Add(-3*time.Hour), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		payload any // nil: connection_init without a payload
		code    int // 0: acknowledged
	}{
		{"Authorization", map[string]any{"Authorization": "Bearer " + good}, 0},
		{"authorization, scheme in lower case", map[string]any{"authorization": "bearer " + good}, 0},
		{"authToken", map[string]any{"authToken": good}, 0},
		{"authToken with Bearer", map[string]any{"authToken": "Bearer " + good}, 0},
		{"other keys are ignored", map[string]any{"Authorization": "Bearer " + good, "client": "dashboard"}, 0},
		{"no payload", nil, CloseUnauthorized},
		{"empty payload", map[string]any{}, CloseUnauthorized},
		{"empty Authorization", map[string]any{"Authorization": ""}, CloseUnauthorized},
		{"unknown key", map[string]any{"token": good}, CloseUnauthorized},
		{"garbage token", map[string]any{"Authorization": "Bearer not-a-token"}, CloseForbidden},
		{"token signed with another secret", map[string]any{"Authorization": "Bearer " + foreign}, CloseForbidden},
		{"expired token", map[string]any{"authToken": expired}, CloseForbidden},
		{"Basic scheme", map[string]any{"Authorization": "Basic " + good}, CloseForbidden},
		{"Bearer without a token", map[string]any{"Authorization": "Bearer "}, CloseForbidden},
		{"token that is not a string", map[string]any{"authToken": 42}, CloseForbidden},
	}
	for _, proto := range wsProtocols {
		for _, tt := range tests {
			t.Run(proto+"/"+tt.name, func(t *testing.T) {
				c := mustDialWS(t, wsURL(s), proto, wsDial{})
				c.init(tt.payload)
				if tt.code == 0 {
					if m := c.next(); m.Type != "connection_ack" {
						t.Fatalf("got %+v, want connection_ack", m)
					}
					return
				}
				msgs, err := c.closed(5 * time.Second)
				reason := map[int]string{CloseUnauthorized: "Unauthorized", CloseForbidden: "Forbidden"}[tt.code]
				wantClose(t, err, tt.code, reason)
				switch proto {
				case protoLegacyWS:
					if len(msgs) != 1 || msgs[0].Type != "connection_error" || !strings.Contains(string(msgs[0].Payload), "message") {
						t.Errorf("messages before the close: %+v, want one connection_error", msgs)
					}
				default:
					if len(msgs) != 0 {
						t.Errorf("messages before the close: %+v, want none", msgs)
					}
				}
			})
		}
	}
}

// TestWebSocketHandshakeAuthorizationHeader: a client that can set headers may authenticate
// the handshake instead; a bad header is refused like any request, and a token in
// connection_init still wins.
func TestWebSocketHandshakeAuthorizationHeader(t *testing.T) {
	a, s := wsServer(t)
	viewer := a.token(t, "vic", auth.Grant{OrganizationID: "acme", Role: auth.RoleViewer})
	for _, proto := range wsProtocols {
		t.Run(proto, func(t *testing.T) {
			c := mustDialWS(t, wsURL(s), proto, wsDial{header: http.Header{"Authorization": {"Bearer " + a.admin(t)}}})
			c.init(map[string]any{})
			if m := c.next(); m.Type != "connection_ack" {
				t.Fatalf("got %+v, want connection_ack", m)
			}
			c.start("1", `{ me { subject } }`)
			if m := c.next(); m.Type != c.dataType() || !strings.Contains(string(m.Payload), `"subject":"admin"`) {
				t.Errorf("me: %+v", m)
			}

			c = mustDialWS(t, wsURL(s), proto, wsDial{header: http.Header{"Authorization": {"Bearer " + a.admin(t)}}})
			c.mustAck(viewer)
			c.start("1", `{ me { subject } }`)
			if m := c.next(); m.Type != c.dataType() || !strings.Contains(string(m.Payload), `"subject":"vic"`) {
				t.Errorf("me with a token in connection_init: %+v", m)
			}

			_, res, err := dialWS(t, wsURL(s), proto, wsDial{header: http.Header{"Authorization": {"Bearer nope"}}})
			if err == nil || res == nil || res.StatusCode != http.StatusUnauthorized {
				t.Errorf("handshake with a bad Authorization header: %v, %+v; want HTTP 401", err, res)
			}
		})
	}
}

// TestWebSocketRunsQueries: an operation over the socket returns its data, then completes;
// errors come back as GraphQL errors.
func TestWebSocketRunsQueries(t *testing.T) {
	a, s := wsServer(t)
	for _, proto := range wsProtocols {
		t.Run(proto, func(t *testing.T) {
			c := mustDialWS(t, wsURL(s), proto, wsDial{})
			c.mustAck(a.admin(t))
			c.start("q1", `{ me { subject } }`)
			m := c.next()
			var res gqlResponse
			if err := json.Unmarshal(m.Payload, &res); err != nil {
				t.Fatal(err)
			}
			if m.Type != c.dataType() || m.ID != "q1" || len(res.Errors) > 0 || !reflect.DeepEqual(res.Data, map[string]any{"me": map[string]any{"subject": "admin"}}) {
				t.Errorf("result: %+v", m)
			}
			if m := c.next(); m.Type != "complete" || m.ID != "q1" {
				t.Errorf("after the result: %+v, want complete", m)
			}

			// Resolver errors arrive with their codes, like over HTTP.
			c.start("q2", `{ instance(id: "nope") { id } }`)
			m = c.next()
			res = gqlResponse{}
			if err := json.Unmarshal(m.Payload, &res); err != nil {
				t.Fatal(err)
			}
			if m.Type != c.dataType() || m.ID != "q2" || !reflect.DeepEqual(res.codes(), []string{"BAD_USER_INPUT"}) {
				t.Errorf("result: %+v", m)
			}
			if m := c.next(); m.Type != "complete" || m.ID != "q2" {
				t.Errorf("after the result: %+v, want complete", m)
			}

			// The connection's limits hold over the socket too.
			c.start("q3", `{ me { subject `)
			if m := c.next(); m.ID != "q3" || (m.Type != "error" && m.Type != c.dataType()) || !strings.Contains(string(m.Payload), "GRAPHQL_PARSE_FAILED") {
				t.Errorf("parse error: %+v", m)
			}
		})
	}
}

// TestWebSocketOrigins: a browser page of another origin cannot open a socket (HTTP 403)
// unless AllowedOrigins lists it; same-origin pages and clients without an Origin can.
func TestWebSocketOrigins(t *testing.T) {
	_, s := wsServer(t)
	_, listed := wsServer(t, func(o *Options) { o.AllowedOrigins = []string{"https://Dash.example.com:443/"} })
	_, anyOrigin := wsServer(t, func(o *Options) { o.AllowedOrigins = []string{"*"} })
	self := "http://" + strings.TrimPrefix(s.URL, "http://")
	listedSelf := "http://" + strings.TrimPrefix(listed.URL, "http://")
	tests := []struct {
		name   string
		server *httptest.Server
		origin string // "" sends none
		ok     bool
	}{
		{"no Origin", s, "", true},
		{"same origin", s, self, true},
		{"other origin", s, "https://evil.example", false},
		{"same host, other port", s, "http://127.0.0.1:1", false},
		{"null origin", s, "null", false},
		{"listed origin", listed, "https://dash.example.com", true},
		{"same origin with a list", listed, listedSelf, true},
		{"unlisted origin", listed, "https://evil.example", false},
		{"listed host, other scheme", listed, "http://dash.example.com", false},
		{"any origin", anyOrigin, "https://evil.example", true},
	}
	for _, proto := range wsProtocols {
		for _, tt := range tests {
			t.Run(proto+"/"+tt.name, func(t *testing.T) {
				h := http.Header{}
				if tt.origin != "" {
					h.Set("Origin", tt.origin)
				}
				c, res, err := dialWS(t, wsURL(tt.server), proto, wsDial{header: h})
				if tt.ok {
					if err != nil {
						t.Fatalf("refused: %v", err)
					}
					c.init(map[string]any{})
					_, err := c.closed(5 * time.Second)
					wantClose(t, err, CloseUnauthorized, "Unauthorized") // the socket works; auth is next
					return
				}
				if err == nil || res == nil || res.StatusCode != http.StatusForbidden {
					t.Fatalf("dial: %v, %+v; want HTTP 403", err, res)
				}
				body, _ := io.ReadAll(res.Body)
				if !strings.Contains(string(body), `"FORBIDDEN"`) {
					t.Errorf("body %s", body)
				}
			})
		}
	}

	var opts Options
	newAPI(t, func(o *Options) { opts = *o })
	for _, bad := range []string{"dash.example.com", "https://dash.example.com/app", "https://"} {
		opts.AllowedOrigins = []string{bad}
		if _, err := New(opts); err == nil {
			t.Errorf("New accepted the allowed origin %q", bad)
		}
	}
}

// TestWebSocketWithoutTokenOnlyUpgrades: only a WebSocket handshake passes without a bearer
// token, and it runs nothing before connection_init.
func TestWebSocketWithoutTokenOnlyUpgrades(t *testing.T) {
	a := newAPI(t)
	// A WebSocket handshake that cannot be completed (no key) goes to the transport, which
	// refuses it without running the query in the URL.
	req := httptest.NewRequest(http.MethodGet, "/graphql?query=%7Bme%7Bsubject%7D%7D", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	rec := a.serve(req)
	if rec.Code != http.StatusBadRequest || strings.Contains(rec.Body.String(), "subject") {
		t.Errorf("broken handshake: %d %s", rec.Code, rec.Body)
	}
	// A POST with the same headers is no WebSocket handshake and needs the token.
	req = postRequest(t, `{ me { subject } }`, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	wantError(t, decodeResponse(t, a.serve(req)), http.StatusUnauthorized, "UNAUTHENTICATED")
	// Another Upgrade needs it too, and with it the request is served as sent: the upgrade
	// is ignored (curl --http2 asks for h2c on every request).
	tok := a.admin(t)
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		h2c := func(token string) *http.Request {
			req := httptest.NewRequest(method, "/graphql?query=%7Bme%7Bsubject%7D%7D", nil)
			if method == http.MethodPost {
				req = postRequest(t, `{ me { subject } }`, nil)
			}
			req.Header.Set("Connection", "Upgrade, HTTP2-Settings")
			req.Header.Set("Upgrade", "h2c")
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			return req
		}
		wantError(t, decodeResponse(t, a.serve(h2c(""))), http.StatusUnauthorized, "UNAUTHENTICATED")
		if res := decodeResponse(t, a.serve(h2c(tok))); res.Status != http.StatusOK || len(res.Errors) > 0 {
			t.Errorf("%s asking for h2c: %d %s", method, res.Status, res.Raw)
		}
	}
}

// TestWebSocketReadLimit: a message larger than the limit (MaxBodyBytes) ends the connection
// with 1009 (message too big).
func TestWebSocketReadLimit(t *testing.T) {
	a, s := wsServer(t, func(o *Options) { o.MaxBodyBytes = 2048 })
	for _, proto := range wsProtocols {
		t.Run(proto, func(t *testing.T) {
			c := mustDialWS(t, wsURL(s), proto, wsDial{})
			c.mustAck(a.admin(t))
			// Just under the limit passes.
			c.start("small", `{ me { subject } }`+strings.Repeat(" ", 1900))
			if m := c.next(); m.Type != c.dataType() || m.ID != "small" {
				t.Fatalf("message under the limit: %+v", m)
			}
			if m := c.next(); m.Type != "complete" {
				t.Fatalf("message under the limit: %+v", m)
			}
			// The client writes it in frames; the server refuses at the first, and its close can
			// beat the rest of the message, whose write then fails with "close sent". But the
			// server reads the rest before closing the connection: closing TCP with unread input
			// resets it, and a reset can destroy the close frame before the peer reads it.
			err := c.write(map[string]any{"type": map[string]string{protoTransportWS: "subscribe", protoLegacyWS: "start"}[proto], "id": "big",
				"payload": map[string]any{"query": `{ me { subject } }` + strings.Repeat(" ", 256<<10)}})
			if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
				t.Errorf("the server reset the connection: %v", err)
			}
			msgs, err := c.closed(5 * time.Second)
			if len(msgs) != 0 {
				t.Errorf("the oversized message got answers: %+v", msgs)
			}
			wantClose(t, err, websocket.CloseMessageTooBig, "")
		})
	}
}

// TestWebSocketKeepAlive: with a short interval, graphql-ws gets "ka" messages,
// graphql-transport-ws gets "ping" messages (answered with "pong"), and both get ping frames;
// a client that answers stays connected.
func TestWebSocketKeepAlive(t *testing.T) {
	// Long enough that a loaded machine's scheduling delays stay well inside the 2×interval a
	// peer may be silent; the test waits for the keep-alives rather than for time to pass.
	const interval = 300 * time.Millisecond
	a, s := wsServer(t, func(o *Options) { o.KeepAliveInterval = interval })
	for _, proto := range wsProtocols {
		t.Run(proto, func(t *testing.T) {
			c := mustDialWS(t, wsURL(s), proto, wsDial{})
			c.mustAck(a.admin(t))
			msgs := &c.pingMsgs
			if proto == protoLegacyWS {
				msgs = &c.kaMsgs
			}
			eventually.Holds(t, 30*interval, func() bool { return c.pingFrames.Load() >= 3 && msgs.Load() >= 3 },
				"%d ping frames and %d keep-alive messages, want 3 of each", c.pingFrames.Load(), msgs.Load())
			select {
			case <-c.done:
				t.Fatalf("socket closed: %v", c.err)
			default:
			}
			c.start("1", `{ me { subject } }`)
			if m := c.next(); m.Type != c.dataType() {
				t.Errorf("query after the keep-alives: %+v", m)
			}
		})
	}
}

// TestWebSocketDropsSilentPeer: a peer that answers no ping frame (one that vanished without
// closing) is dropped after twice the interval, in both protocols: the legacy one has no ping
// of its own.
func TestWebSocketDropsSilentPeer(t *testing.T) {
	const interval = 100 * time.Millisecond
	a, s := wsServer(t, func(o *Options) { o.KeepAliveInterval = interval })
	for _, proto := range wsProtocols {
		t.Run(proto, func(t *testing.T) {
			c := mustDialWS(t, wsURL(s), proto, wsDial{silent: true})
			c.mustAck(a.admin(t))
			start := time.Now()
			if _, err := c.closed(5 * time.Second); err == nil {
				t.Error("closed without an error")
			}
			if d := time.Since(start); d < interval {
				t.Errorf("dropped after %v, before a ping was due", d)
			}
		})
	}
}

// TestWebSocketInitPayloadNotAnObject: a connection_init whose payload is not an object closes
// the socket with 4400, after a connection_error on graphql-ws.
func TestWebSocketInitPayloadNotAnObject(t *testing.T) {
	_, s := wsServer(t)
	for _, tt := range []struct{ proto, reason string }{
		{protoTransportWS, `Invalid message received: the "payload" of connection_init must be an object`},
		{protoLegacyWS, "Bad request"},
	} {
		t.Run(tt.proto, func(t *testing.T) {
			c := mustDialWS(t, wsURL(s), tt.proto, wsDial{})
			c.init("Bearer x")
			msgs, err := c.closed(5 * time.Second)
			wantClose(t, err, CloseBadRequest, tt.reason)
			if tt.proto == protoLegacyWS && (len(msgs) != 1 || msgs[0].Type != "connection_error") {
				t.Errorf("before the close: %+v, want one connection_error", msgs)
			}
		})
	}
}

// TestWebSocketClosesOnShutdown: when the server's context ends (SIGTERM in computeql), open
// sockets get a 1001 close frame, and the connection gauge returns to zero.
func TestWebSocketClosesOnShutdown(t *testing.T) {
	reg := prometheus.NewRegistry()
	base, shutdown := context.WithCancel(context.Background())
	defer shutdown()
	a := newAPI(t, func(o *Options) { o.Registry, o.Context = reg, base })
	s := httptest.NewServer(a.handler)
	t.Cleanup(s.Close)
	var clients []*wsClient
	for _, proto := range wsProtocols {
		c := mustDialWS(t, wsURL(s), proto, wsDial{})
		c.mustAck(a.admin(t))
		clients = append(clients, c)
	}
	if n := metrictest.Value(t, reg, "computeql_websocket_connections"); n != 2 {
		t.Errorf("open connections gauge = %v, want 2", n)
	}
	shutdown()
	for _, c := range clients {
		_, err := c.closed(5 * time.Second)
		wantClose(t, err, websocket.CloseGoingAway, "server shutting down")
	}
	deadline := time.Now().Add(5 * time.Second)
	for metrictest.Value(t, reg, "computeql_websocket_connections") != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := metrictest.Value(t, reg, "computeql_websocket_connections"); n != 0 {
		t.Errorf("open connections gauge = %v after shutdown", n)
	}
}

// TestWebSocketCloseMetrics counts the refusals by close code.
func TestWebSocketCloseMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, s := wsServer(t, func(o *Options) { o.Registry = reg })
	c := mustDialWS(t, wsURL(s), protoTransportWS, wsDial{})
	c.init(nil)
	c.closed(5 * time.Second)
	c = mustDialWS(t, wsURL(s), protoLegacyWS, wsDial{})
	c.init(map[string]any{"authToken": "x"})
	c.closed(5 * time.Second)
	want := `
# HELP computeql_websocket_closes_total WebSocket close frames the server sent, by close code (4401 no token, 4403 bad token, 1009 message too big, 1001 shutdown).
# TYPE computeql_websocket_closes_total counter
computeql_websocket_closes_total{code="4401"} 1
computeql_websocket_closes_total{code="4403"} 1
`
	// The server counts a close frame once written, which may be after the client read it.
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err = testutil.GatherAndCompare(reg, strings.NewReader(want), "computeql_websocket_closes_total"); err == nil {
			break
		}
	}
	if err != nil {
		t.Error(err)
	}
}

// sseEvent is one server-sent event.
type sseEvent struct {
	Event, Data string
}

// readSSE reads events until the stream ends, skipping comments (keep-alives).
func readSSE(r io.Reader) ([]sseEvent, error) {
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur != (sseEvent{}) {
				out = append(out, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event:"):
			cur.Event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			cur.Data += strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		}
	}
	return out, sc.Err()
}

// ssePost POSTs an operation asking for an event stream.
func ssePost(tb testing.TB, s *httptest.Server, token, query string) *http.Response {
	tb.Helper()
	body, _ := json.Marshal(map[string]any{"query": query})
	req, err := http.NewRequest(http.MethodPost, s.URL+"/graphql", strings.NewReader(string(body)))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := s.Client().Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { res.Body.Close() })
	return res
}

// TestSSERunsQueries: an operation POSTed with Accept: text/event-stream and the bearer token
// streams a "next" event with the result, then "complete"; without the token it is a 401.
func TestSSERunsQueries(t *testing.T) {
	a, s := wsServer(t)
	res := ssePost(t, s, a.admin(t), `{ me { subject } }`)
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, Content-Type %q", res.StatusCode, res.Header.Get("Content-Type"))
	}
	events, err := readSSE(res.Body)
	if err != nil {
		t.Fatalf("read stream: %v", err)
	}
	if len(events) != 2 || events[0].Event != "next" || events[1].Event != "complete" {
		t.Fatalf("events %+v, want next then complete", events)
	}
	var got gqlResponse
	if err := json.Unmarshal([]byte(events[0].Data), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Errors) > 0 || !reflect.DeepEqual(got.Data, map[string]any{"me": map[string]any{"subject": "admin"}}) {
		t.Errorf("next: %s", events[0].Data)
	}

	res = ssePost(t, s, "", `{ me { subject } }`)
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("without a token: status %d", res.StatusCode)
	}
}

// TestStreamDeadlinesOutliveServerTimeouts: an SSE stream lasts longer than the http.Server's
// ReadTimeout and WriteTimeout (computeql sets 30s), which would otherwise cancel it.
func TestStreamDeadlinesOutliveServerTimeouts(t *testing.T) {
	const timeout = 200 * time.Millisecond
	stream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 8 {
			if i > 0 {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(timeout / 2):
				}
			}
			fmt.Fprintf(w, "event: next\ndata: %d\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "event: complete\n\n")
	})
	for _, method := range []string{http.MethodPost, http.MethodGet} {
		serve := func(h http.Handler) int {
			s := httptest.NewUnstartedServer(h)
			s.Config.ReadTimeout, s.Config.WriteTimeout = timeout, timeout
			s.Start()
			defer s.Close()
			var res *http.Response
			if method == http.MethodGet {
				res = sseGet(t, s.URL, "", `{ x }`, nil) // a browser's EventSource
			} else {
				res = ssePost(t, s, "", `{ x }`)
			}
			events, _ := readSSE(res.Body) // a cut stream is an error
			return len(events)
		}
		if n := serve(streamDeadlines(time.Second, stream)); n != 9 {
			t.Errorf("%s with streamDeadlines: %d events, want 9", method, n)
		}
		// The control: the same stream without it is cut by the server's timeouts.
		if n := serve(stream); n >= 9 {
			t.Errorf("%s without streamDeadlines: %d events; the test does not exercise the timeouts", method, n)
		}
	}
}
