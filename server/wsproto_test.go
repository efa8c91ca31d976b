package server

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/metrictest"
)

// raw sends a frame as is, whatever it holds.
func (c *wsClient) raw(frame string) {
	c.tb.Helper()
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.conn.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
		c.tb.Errorf("write: %v", err)
	}
}

// TestTransportWSClosesPerProtocol drives graphql-transport-ws with raw frames through every
// close its PROTOCOL.md prescribes: 4400 for any message of a type or shape it does not define
// (including a subscribe without id or payload), 4401 for a subscribe before the connection is
// acknowledged, 4409 for a subscribe that reuses a running subscription's id, 4429 for a second
// connection_init, 4408 when no connection_init comes in time.
func TestTransportWSClosesPerProtocol(t *testing.T) {
	a, s := wsServer(t, func(o *Options) { o.initTimeout = 300 * time.Millisecond })
	tok := a.admin(t)
	subscription := `{"type":"subscribe","id":"s","payload":{"query":"subscription { instanceEvents(organizationId: \"acme\") { kind } }"}}`
	for _, tt := range []struct {
		name   string
		ack    bool     // connection_init with a token first, and its connection_ack awaited
		frames []string // then these frames, as they are
		code   int
		reason string
	}{
		{name: "not JSON", ack: true, frames: []string{`{"type":`}, code: CloseBadRequest, reason: "Invalid message received: not a JSON object"},
		{name: "not an object", ack: true, frames: []string{`["subscribe"]`}, code: CloseBadRequest, reason: "Invalid message received: not a JSON object"},
		{name: "no type", ack: true, frames: []string{`{"id":"1"}`}, code: CloseBadRequest, reason: `Invalid message received: "type" must be a string`},
		{name: "type not a string", ack: true, frames: []string{`{"type":1}`}, code: CloseBadRequest, reason: `Invalid message received: "type" must be a string`},
		{name: "type in other case", ack: true, frames: []string{`{"Type":"ping"}`}, code: CloseBadRequest, reason: `Invalid message received: "type" must be a string`},
		{name: "unknown type", ack: true, frames: []string{`{"type":"nope"}`}, code: CloseBadRequest, reason: `Invalid message received: unexpected type "nope"`},
		{name: "legacy type", ack: true, frames: []string{`{"type":"start","id":"1","payload":{"query":"{ me { subject } }"}}`}, code: CloseBadRequest, reason: `Invalid message received: unexpected type "start"`},
		{name: "a server's type", ack: true, frames: []string{`{"type":"next","id":"1","payload":{}}`}, code: CloseBadRequest, reason: `Invalid message received: unexpected type "next"`},
		{name: "connection_ack from the client", ack: true, frames: []string{`{"type":"connection_ack"}`}, code: CloseBadRequest, reason: `Invalid message received: unexpected type "connection_ack"`},
		{name: "subscribe without id", ack: true, frames: []string{`{"type":"subscribe","payload":{"query":"{ me { subject } }"}}`}, code: CloseBadRequest,
			reason: `Invalid message received: "subscribe" requires a non-empty string "id"`},
		{name: "subscribe with an empty id", ack: true, frames: []string{`{"type":"subscribe","id":"","payload":{"query":"{ me { subject } }"}}`}, code: CloseBadRequest,
			reason: `Invalid message received: "subscribe" requires a non-empty string "id"`},
		{name: "subscribe with a number for id", ack: true, frames: []string{`{"type":"subscribe","id":1,"payload":{"query":"{ me { subject } }"}}`}, code: CloseBadRequest,
			reason: `Invalid message received: "subscribe" requires a non-empty string "id"`},
		{name: "subscribe without payload", ack: true, frames: []string{`{"type":"subscribe","id":"1"}`}, code: CloseBadRequest,
			reason: `Invalid message received: the "payload" must be an object with a "query"`},
		{name: "subscribe without query", ack: true, frames: []string{`{"type":"subscribe","id":"1","payload":{}}`}, code: CloseBadRequest,
			reason: `Invalid message received: "payload.query" must be a string`},
		{name: "subscribe with variables not an object", ack: true, frames: []string{`{"type":"subscribe","id":"1","payload":{"query":"{ me { subject } }","variables":[1]}}`},
			code: CloseBadRequest, reason: `Invalid message received: "payload.variables" must be an object`},
		{name: "an id over 128 bytes", ack: true, frames: []string{`{"type":"subscribe","id":"` + strings.Repeat("i", 129) + `","payload":{"query":"{ me { subject } }"}}`},
			code: CloseBadRequest, reason: `Invalid message received: an "id" is at most 128 bytes`},
		{name: "complete without id", ack: true, frames: []string{`{"type":"complete"}`}, code: CloseBadRequest,
			reason: `Invalid message received: "complete" requires a non-empty string "id"`},
		{name: "ping with a payload not an object", frames: []string{`{"type":"ping","payload":"x"}`}, code: CloseBadRequest,
			reason: `Invalid message received: the "payload" of ping must be an object`},
		{name: "subscribe before connection_init", frames: []string{subscription}, code: CloseUnauthorized, reason: "Unauthorized"},
		{name: "a second connection_init", ack: true, frames: []string{`{"type":"connection_init"}`}, code: CloseTooManyInitRequests, reason: "Too many initialisation requests"},
		{name: "a second connection_init before the ack", frames: []string{`{"type":"connection_init","payload":{"Authorization":"Bearer ` + tok + `"}}`, `{"type":"connection_init"}`},
			code: CloseTooManyInitRequests, reason: "Too many initialisation requests"},
		{name: "a subscription id in use", ack: true, frames: []string{subscription, subscription}, code: CloseSubscriberExists, reason: "Subscriber for s already exists"},
		{name: "no connection_init in time", code: CloseInitTimeout, reason: "Connection initialisation timeout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := mustDialWS(t, wsURL(s), protoTransportWS, wsDial{})
			if tt.ack {
				c.mustAck(tok)
			}
			for _, f := range tt.frames {
				c.raw(f)
			}
			_, err := c.closed(5 * time.Second)
			wantClose(t, err, tt.code, tt.reason)
		})
	}
}

// TestTransportWSMessages: what graphql-transport-ws answers — pong to ping at any time, with
// the ping's payload; next then complete for a query; error alone (no complete) for an
// operation refused before it ran; nothing after the client completes a subscription, whose
// id is then free again.
func TestTransportWSMessages(t *testing.T) {
	a, s := wsServer(t)
	tok := a.admin(t)
	c := mustDialWS(t, wsURL(s), protoTransportWS, wsDial{})
	c.raw(`{"type":"ping","payload":{"n":1}}`) // before connection_init: allowed
	if m := c.next(); m.Type != "pong" || string(m.Payload) != `{"n":1}` {
		t.Fatalf("after ping: %+v, want pong with the ping's payload", m)
	}
	c.mustAck(tok)
	c.raw(`{"type":"ping"}`)
	if m := c.next(); m.Type != "pong" || m.Payload != nil {
		t.Fatalf("after ping: %+v, want pong without payload", m)
	}
	c.raw(`{"type":"pong"}`) // a unidirectional heartbeat: no answer, and the socket stays

	// A query: next, then complete.
	c.raw(`{"type":"subscribe","id":"q","payload":{"query":"{ me { subject } }"}}`)
	if m := c.next(); m.Type != "next" || m.ID != "q" || !strings.HasPrefix(string(m.Payload), `{"data":{"me":{"subject":"admin"}},`) {
		t.Fatalf("query: %+v %s", m, m.Payload)
	}
	if m := c.next(); m.Type != "complete" || m.ID != "q" {
		t.Fatalf("after the query's result: %+v, want complete", m)
	}

	// Refused before running: error with the list of errors, and no complete after it (the
	// pong shows the server has nothing else queued for the operation).
	for _, tt := range []struct{ name, frame, code string }{
		{"validation", `{"type":"subscribe","id":"v","payload":{"query":"{ nope }"}}`, "GRAPHQL_VALIDATION_FAILED"},
		{"subscription refused", `{"type":"subscribe","id":"v","payload":{"query":"subscription { instanceEvents(organizationId: \"nope\") { kind } }"}}`, "NOT_FOUND"},
	} {
		c.raw(tt.frame)
		m := c.next()
		var errs []struct {
			Message    string         `json:"message"`
			Extensions map[string]any `json:"extensions"`
		}
		if m.Type != "error" || m.ID != "v" || json.Unmarshal(m.Payload, &errs) != nil || len(errs) == 0 || errs[0].Extensions["code"] != tt.code {
			t.Fatalf("%s: %+v %s, want error with an error list of code %s", tt.name, m, m.Payload, tt.code)
		}
		c.raw(`{"type":"ping"}`)
		if m := c.next(); m.Type != "pong" {
			t.Fatalf("%s: after the error: %+v, want nothing before the pong", tt.name, m)
		}
	}

	// A subscription the client completes: nothing is sent back, and its id may be reused.
	sub := `{"type":"subscribe","id":"s","payload":{"query":"subscription { instanceEvents(organizationId: \"acme\") { kind } }"}}`
	c.raw(sub)
	if ev := c.event(); ev.Kind != "SYNCED" {
		t.Fatalf("first event %+v, want SYNCED (no instances)", ev)
	}
	c.raw(`{"type":"complete","id":"s"}`)
	c.raw(`{"type":"ping"}`)
	if m := c.next(); m.Type != "pong" {
		t.Fatalf("after the client's complete: %+v, want nothing before the pong", m)
	}
	c.raw(sub)
	if ev := c.event(); ev.Kind != "SYNCED" {
		t.Fatalf("after reusing the id: %+v, want SYNCED", ev)
	}
	c.raw(`{"type":"complete","id":"unknown"}`) // completing what is not running: ignored
	c.raw(`{"type":"ping"}`)
	if m := c.next(); m.Type != "pong" {
		t.Fatalf("after completing an unknown id: %+v, want pong", m)
	}
}

// TestTransportWSMessagesArrivingTogether: messages that reach the server in one segment, and
// one that arrives in pieces, are each answered: the reader waits on the socket only once its
// buffer holds none of them.
func TestTransportWSMessagesArrivingTogether(t *testing.T) {
	a, s := wsServer(t)
	tok := a.admin(t)
	c := mustDialWS(t, wsURL(s), protoTransportWS, wsDial{})
	nc := c.conn.NetConn()
	together := maskedTextFrame(`{"type":"connection_init","payload":{"Authorization":"Bearer `+tok+`"}}`) +
		maskedTextFrame(`{"type":"ping","payload":{"n":1}}`) + maskedTextFrame(`{"type":"ping","payload":{"n":2}}`)
	c.writeMu.Lock()
	_, err := nc.Write([]byte(together))
	c.writeMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if m := c.next(); m.Type != "connection_ack" {
		t.Fatalf("after connection_init: %+v, want connection_ack", m)
	}
	for _, want := range []string{`{"n":1}`, `{"n":2}`} {
		if m := c.next(); m.Type != "pong" || string(m.Payload) != want {
			t.Fatalf("after the pings: %+v, want pong with %s", m, want)
		}
	}
	pieces := maskedTextFrame(`{"type":"ping","payload":{"n":3}}`)
	for _, p := range []string{pieces[:1], pieces[1:9], pieces[9:]} {
		c.writeMu.Lock()
		_, err := nc.Write([]byte(p))
		c.writeMu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	if m := c.next(); m.Type != "pong" || string(m.Payload) != `{"n":3}` {
		t.Fatalf("after a ping sent in pieces: %+v, want pong with {\"n\":3}", m)
	}
}

// maskedTextFrame encodes a text message of less than 64 KiB as a client frame, masked with
// a zero key (which leaves the payload as it is).
func maskedTextFrame(payload string) string {
	header := []byte{0x81, 0x80 | byte(len(payload))}
	if len(payload) > 125 {
		header = []byte{0x81, 0x80 | 126, byte(len(payload) >> 8), byte(len(payload))}
	}
	return string(append(header, 0, 0, 0, 0)) + payload
}

// TestTransportWSWithoutSubprotocol: a handshake that offers neither subprotocol is closed
// with 4406.
func TestTransportWSWithoutSubprotocol(t *testing.T) {
	_, s := wsServer(t)
	conn, _, err := (&websocket.Dialer{HandshakeTimeout: 5 * time.Second}).Dial(wsURL(s), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err = conn.ReadMessage()
	wantClose(t, err, CloseSubprotocolNotAcceptable, "Subprotocol not acceptable")
}

// TestLegacyWSMessages: the legacy graphql-ws protocol as subscriptions-transport-ws serves it:
// a start before connection_init is refused (connection_error, then 4401); a frame it cannot
// read gets connection_error and one of an unknown type an error, and the socket stays; stop
// gets complete; a start reusing a running id replaces that operation; connection_terminate
// closes the socket.
func TestLegacyWSMessages(t *testing.T) {
	a, s := wsServer(t)
	tok := a.admin(t)

	early := mustDialWS(t, wsURL(s), protoLegacyWS, wsDial{})
	early.raw(`{"type":"start","id":"1","payload":{"query":"{ me { subject } }"}}`)
	msgs, err := early.closed(5 * time.Second)
	wantClose(t, err, CloseUnauthorized, "Unauthorized")
	if len(msgs) != 1 || msgs[0].Type != "connection_error" {
		t.Errorf("before the close: %+v, want one connection_error", msgs)
	}

	c := mustDialWS(t, wsURL(s), protoLegacyWS, wsDial{})
	c.mustAck(tok)
	c.raw(`{"type":`)
	if m := c.next(); m.Type != "connection_error" {
		t.Fatalf("after a frame that is not JSON: %+v, want connection_error", m)
	}
	c.raw(`{"type":"nope","id":"x"}`)
	if m := c.next(); m.Type != "error" || m.ID != "x" {
		t.Fatalf("after an unknown type: %+v, want error of x", m)
	}
	sub := `{"type":"start","id":"s","payload":{"query":"subscription { instanceEvents(organizationId: \"acme\") { kind } }"}}`
	c.raw(sub)
	if ev := c.event(); ev.Kind != "SYNCED" {
		t.Fatalf("first event %+v, want SYNCED", ev)
	}
	c.raw(sub) // replaces the running one: nothing is sent for the first
	if ev := c.event(); ev.Kind != "SYNCED" {
		t.Fatalf("after a start reusing the id: %+v, want the new one's SYNCED", ev)
	}
	c.raw(`{"type":"stop","id":"s"}`)
	if m := c.next(); m.Type != "complete" || m.ID != "s" {
		t.Fatalf("after stop: %+v, want complete of s", m)
	}
	c.raw(`{"type":"start","id":"q","payload":{"query":"{ nope }"}}`)
	if codes, m := c.opErrorCodes(); len(codes) != 1 || codes[0] != "GRAPHQL_VALIDATION_FAILED" || m.Type != "data" {
		t.Fatalf("an invalid query: %s %s, want data with a validation error", m.Type, m.Payload)
	}
	if m := c.next(); m.Type != "complete" || m.ID != "q" {
		t.Fatalf("after the invalid query's result: %+v, want complete", m)
	}
	c.raw(`{"type":"connection_terminate"}`)
	_, err = c.closed(5 * time.Second)
	wantClose(t, err, websocket.CloseNormalClosure, "")
}

// TestIdleSubscriptionsLeaveTheFeedWithTheirSocket: an idle subscription has no goroutine of
// its own; when its socket goes (the peer vanishes, or completes it, or the server closes the
// socket) it still gives back its place in the feed.
func TestIdleSubscriptionsLeaveTheFeedWithTheirSocket(t *testing.T) {
	a, s := wsServer(t, func(o *Options) { o.RateLimit = -1 })
	reg := prometheus.NewRegistry()
	if err := a.feed.Register(reg); err != nil {
		t.Fatal(err)
	}
	tok := a.admin(t)
	const n = 12
	clients := make([]*wsClient, n)
	for i := range clients {
		clients[i] = subscribeWS(t, s, wsProtocols[i%2], tok, subQuery("acme", ""))
		if ev := clients[i].event(); ev.Kind != "SYNCED" {
			t.Fatalf("first event %+v, want SYNCED", ev)
		}
	}
	if got := metrictest.Value(t, reg, "computeql_subscriptions_active"); got != n {
		t.Fatalf("%v subscriptions in the feed, want %d", got, n)
	}
	for i, c := range clients {
		switch i % 3 {
		case 0:
			c.conn.Close() // the peer vanishes
		case 1:
			c.stop() // completes, then closes
		case 2:
			c.raw(`{"type":"connection_init"}`) // a second init: the server closes the socket
		}
	}
	eventually.Holds(t, 10*time.Second, func() bool { return metrictest.Value(t, reg, "computeql_subscriptions_active") == 0 },
		"%v subscriptions still in the feed after their sockets went", eventually.Lazy(func() string {
			return fmt.Sprint(metrictest.Value(t, reg, "computeql_subscriptions_active"))
		}))
}

// TestOperationFloodIsHeldBack: a client that sends operation after operation and reads none
// of the answers holds at most a few goroutines on the server: the socket's reader waits for
// a place among the operations in flight, and the client's own socket fills up behind it.
func TestOperationFloodIsHeldBack(t *testing.T) {
	a := newAPI(t, func(o *Options) { o.RateLimit = -1 })
	s := httptest.NewUnstartedServer(a.handler)
	s.Listener = smallBufferListener{s.Listener} // the server's writes block after a few KB
	s.Start()
	t.Cleanup(s.Close)
	tok := a.admin(t)
	base := runtime.NumGoroutine()
	d := websocket.Dialer{Subprotocols: []string{protoTransportWS}, HandshakeTimeout: 5 * time.Second,
		NetDial: func(network, addr string) (net.Conn, error) {
			c, err := net.Dial(network, addr)
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetReadBuffer(4096) // the client reads nothing: the server's writes block soon
			}
			return c, err
		}}
	conn, _, err := d.Dial(wsURL(s), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.WriteJSON(map[string]any{"type": "connection_init", "payload": map[string]any{"Authorization": "Bearer " + tok}}); err != nil {
		t.Fatal(err)
	}
	// Writes stop being taken once the server stops reading; the flood runs until then.
	var sent atomic.Int32
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		for i := 0; i < 20_000; i++ {
			conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
			if conn.WriteJSON(map[string]any{"type": "subscribe", "id": fmt.Sprint("q", i), "payload": map[string]any{"query": "{ me { subject } }"}}) != nil {
				return
			}
			sent.Add(1)
		}
	}()
	<-flooded
	if sent.Load() < 100 {
		t.Fatalf("only %d operations went out: the test measures nothing", sent.Load())
	}
	if g := runtime.NumGoroutine() - base; g > maxInFlight+20 {
		t.Errorf("%d goroutines more than before, after %d operations sent and none read; want at most about %d", g, sent.Load(), maxInFlight)
	}
}
