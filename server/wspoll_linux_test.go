package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/metrictest"
)

// TestIdleSocketsWaitInThePoller: a socket waiting for its peer's next message has no
// goroutine of its own but waits in the poller (the idle gauge counts it); it still delivers
// its subscription's events, wakes for the peer's next message, and leaves the poller when it
// ends, however it ends.
func TestIdleSocketsWaitInThePoller(t *testing.T) {
	const n = 12
	reg := prometheus.NewRegistry()
	a, s := wsServer(t, func(o *Options) { o.Registry, o.RateLimit = reg, -1 })
	tok := a.admin(t)
	inst := a.mustCreate(t, tok, createInput("one"))
	idle := func() float64 { return metrictest.Value(t, reg, "computeql_websocket_idle_connections") }
	idleIs := func(want float64, when string) {
		t.Helper()
		eventually.Holds(t, 10*time.Second, func() bool { return idle() == want },
			"%s: %v sockets in the poller, want %v", when, eventually.Lazy(func() string { return fmt.Sprint(idle()) }), want)
	}
	clients := make([]*wsClient, n)
	for i := range clients {
		clients[i] = subscribeWS(t, s, wsProtocols[i%2], tok, subQuery("acme", ""))
		if ev := clients[i].event(); ev.Kind != "SNAPSHOT" {
			t.Fatalf("first event %+v, want SNAPSHOT", ev)
		}
		clients[i].synced()
	}
	idleIs(n, "with every subscription live")

	a.describe(t, tok, inst.ID, "parked")
	for _, c := range clients {
		if ev := c.event(); ev.Instance.ID != inst.ID || ev.Kind != "UPDATED" {
			t.Fatalf("a parked socket's subscriber got %+v, want the update of %s", ev, inst.ID)
		}
	}
	for _, c := range clients { // each read by a reader the poller starts
		send, want := `{"type":"ping"}`, "pong"
		if c.proto == protoLegacyWS {
			send, want = `{"type":"stop","id":"s"}`, "complete"
		}
		c.raw(send)
		if m := c.next(); m.Type != want {
			t.Fatalf("after %s: %+v, want %s", send, m, want)
		}
	}
	idleIs(n, "once the messages were handled")

	for i, c := range clients {
		switch i % 3 {
		case 0:
			c.conn.Close() // the peer vanishes
		case 1:
			c.raw(`{"type":"connection_init"}`) // refused: the server closes the socket
		case 2:
			c.conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
		}
	}
	idleIs(0, "after the sockets ended")
	eventually.Holds(t, 10*time.Second, func() bool { return metrictest.Value(t, reg, "computeql_websocket_connections") == 0 },
		"connections still open after every peer went")
}

// TestParkedSocketClosedByTheServer: when the server closes a parked socket whose peer never
// answers the close frame (it reads nothing), the socket still goes after the grace: closing
// takes it out of the poller, to a reader that enforces the grace. Here the peer sends no
// connection_init either, and the server closes the socket with 4408.
func TestParkedSocketClosedByTheServer(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, s := wsServer(t, func(o *Options) { o.Registry, o.initTimeout = reg, 300*time.Millisecond })
	conn, _, err := (&websocket.Dialer{Subprotocols: []string{protoTransportWS}, HandshakeTimeout: 5 * time.Second}).Dial(wsURL(s), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	eventually.Holds(t, 10*time.Second, func() bool { return metrictest.Value(t, reg, "computeql_websocket_closes_total", "code", "4408") == 1 },
		"no 4408 close for a socket without connection_init")
	eventually.Holds(t, 10*time.Second, func() bool { return metrictest.Value(t, reg, "computeql_websocket_connections") == 0 },
		"the socket was not dropped after the close grace")
	if n := metrictest.Value(t, reg, "computeql_websocket_idle_connections"); n != 0 {
		t.Errorf("%v sockets in the poller after the socket was dropped", n)
	}
}
