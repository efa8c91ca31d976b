package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/feed"
)

// silence is how long a subscriber must stay quiet for "nothing else arrives".
const silence = 300 * time.Millisecond

// subEvent is one instanceEvents subscription event as subQuery selects it.
type subEvent struct {
	Cursor        string   `json:"cursor"`
	Kind          string   `json:"kind"`
	ChangedFields []string `json:"changedFields"`
	Instance      struct {
		ID         string `json:"id"`
		Name       string `json:"name"`
		Generation int    `json:"generation"`
		Status     struct {
			ProvisioningStatus string `json:"provisioningStatus"`
		} `json:"status"`
	} `json:"instance"`
}

// subQuery is the instanceEvents subscription of an organization, after a cursor when given.
func subQuery(org, after string) string {
	args := fmt.Sprintf("organizationId: %q", org)
	if after != "" {
		args += fmt.Sprintf(", after: %q", after)
	}
	return `subscription { instanceEvents(` + args + `) { cursor kind changedFields instance { id name generation status { provisioningStatus } } } }`
}

// subscribeWS dials the server with proto, authenticates with the token and starts the
// subscription as operation "s".
func subscribeWS(tb testing.TB, s *httptest.Server, proto, token, query string) *wsClient {
	tb.Helper()
	c := mustDialWS(tb, wsURL(s), proto, wsDial{})
	c.mustAck(token)
	c.start("s", query)
	return c
}

// synced reads the SYNCED event that ends a snapshot: a cursor, and no instance.
func (c *wsClient) synced() subEvent {
	c.tb.Helper()
	ev := c.event()
	if ev.Kind != "SYNCED" || ev.Cursor == "" || ev.Instance.ID != "" {
		c.tb.Fatalf("got %+v, want SYNCED with a cursor and no instance", ev)
	}
	return ev
}

// event reads the next message, which must be a result of operation "s" without errors.
func (c *wsClient) event() subEvent { c.tb.Helper(); return nextEvent[subEvent](c) }

// nextEvent reads the next message, which must be a result of operation "s" without errors,
// and decodes its instanceEvents into T.
func nextEvent[T any](c *wsClient) T {
	c.tb.Helper()
	m := c.next()
	if m.Type != c.dataType() || m.ID != "s" {
		c.tb.Fatalf("got %s %s %s, want %s of s", m.Type, m.ID, m.Payload, c.dataType())
	}
	var res gqlResponse
	if err := json.Unmarshal(m.Payload, &res); err != nil {
		c.tb.Fatal(err)
	}
	if len(res.Errors) > 0 || res.Data["instanceEvents"] == nil {
		c.tb.Fatalf("event with errors: %s", m.Payload)
	}
	var ev T
	decode(c.tb, res.Data["instanceEvents"], &ev)
	return ev
}

// quiet checks that no message arrives (and the socket stays open) for d.
func (c *wsClient) quiet(d time.Duration) {
	c.tb.Helper()
	select {
	case m := <-c.msgs:
		c.tb.Errorf("unexpected message %s %s %s", m.Type, m.ID, m.Payload)
	case <-c.done:
		c.tb.Errorf("socket closed: %v", c.err)
	case <-time.After(d):
	}
}

// opErrorCodes reads the next message and returns the extensions.code of the errors it
// carries: an "error" message (payload a list of errors, or one error in graphql-ws) or a
// result with errors.
func (c *wsClient) opErrorCodes() ([]string, wsMessage) {
	c.tb.Helper()
	m := c.next()
	type gqlErr struct {
		Message    string         `json:"message"`
		Extensions map[string]any `json:"extensions"`
	}
	var errs []gqlErr
	switch m.Type {
	case "error":
		if err := json.Unmarshal(m.Payload, &errs); err != nil {
			var one gqlErr
			if err := json.Unmarshal(m.Payload, &one); err != nil {
				c.tb.Fatalf("error payload %s", m.Payload)
			}
			errs = []gqlErr{one}
		}
	case c.dataType():
		var res struct {
			Errors []gqlErr `json:"errors"`
		}
		if err := json.Unmarshal(m.Payload, &res); err != nil {
			c.tb.Fatal(err)
		}
		errs = res.Errors
	default:
		c.tb.Fatalf("got %s %s, want an error", m.Type, m.Payload)
	}
	var codes []string
	for _, e := range errs {
		code, _ := e.Extensions["code"].(string)
		codes = append(codes, code)
	}
	return codes, m
}

// stop ends operation "s" and closes the socket.
func (c *wsClient) stop() {
	t := "complete"
	if c.proto == protoLegacyWS {
		t = "stop"
	}
	c.write(map[string]any{"type": t, "id": "s"})
	close(c.quit)
	c.conn.Close()
	<-c.done
}

const describeMutation = `mutation($id: ID!, $d: String) { updateInstance(input: {id: $id, description: $d}) { instance { id } } }`

func (a *api) describe(tb testing.TB, token, id, description string) {
	tb.Helper()
	a.mustPost(tb, token, describeMutation, map[string]any{"id": id, "d": description})
}

func (a *api) mustDelete(tb testing.TB, token, id string) {
	tb.Helper()
	res, p := a.remove(tb, token, id)
	if res.Status != 200 || len(res.Errors) > 0 || len(p.UserErrors) > 0 {
		tb.Fatalf("delete %s: %s", id, res.Raw)
	}
}

func serveAPI(tb testing.TB, a *api) *httptest.Server {
	s := httptest.NewServer(a.handler)
	tb.Cleanup(s.Close)
	return s
}

// TestSubscriptionSnapshotThenLive: one SNAPSHOT per instance, then an update as UPDATED with
// changedFields [description], then the delete as UPDATED naming deletedAt, and nothing else.
func TestSubscriptionSnapshotThenLive(t *testing.T) {
	for _, proto := range wsProtocols {
		t.Run(proto, func(t *testing.T) {
			a, s := wsServer(t)
			tok := a.admin(t)
			one := a.mustCreate(t, tok, createInput("one"))
			two := a.mustCreate(t, tok, createInput("two"))
			c := subscribeWS(t, s, proto, tok, subQuery("acme", ""))

			got := map[string]subEvent{}
			for range 2 {
				ev := c.event()
				if ev.Kind != "SNAPSHOT" || ev.Cursor == "" || len(ev.ChangedFields) != 0 {
					t.Fatalf("snapshot event %+v", ev)
				}
				got[ev.Instance.ID] = ev
			}
			if got[one.ID].Instance.Name != "one" || got[two.ID].Instance.Name != "two" || got[one.ID].Instance.Status.ProvisioningStatus == "" {
				t.Fatalf("snapshot %+v, want one and two", got)
			}
			// Each snapshot event's cursor names its instance; SYNCED's names where the
			// subscription went live.
			if got[one.ID].Cursor == got[two.ID].Cursor {
				t.Errorf("snapshot cursors are the same: %q", got[one.ID].Cursor)
			}
			synced := c.synced()

			a.describe(t, tok, one.ID, "live")
			ev := c.event()
			if ev.Kind != "UPDATED" || ev.Instance.ID != one.ID || !reflect.DeepEqual(ev.ChangedFields, []string{"description"}) || ev.Instance.Generation != one.Generation+1 {
				t.Errorf("update event %+v", ev)
			}
			if ev.Cursor == got[one.ID].Cursor || ev.Cursor == synced.Cursor {
				t.Errorf("update event has the snapshot's cursor")
			}

			a.mustDelete(t, tok, two.ID)
			ev = c.event()
			if ev.Kind != "UPDATED" || ev.Instance.ID != two.ID || !slices.Contains(ev.ChangedFields, "deletedAt") {
				t.Errorf("delete event %+v", ev)
			}
			c.quiet(silence)
		})
	}
}

// TestSubscriptionResume: resubscribing after the last cursor received replays exactly the
// changes made meanwhile, in order, without a snapshot, then continues live.
func TestSubscriptionResume(t *testing.T) {
	for _, proto := range wsProtocols {
		t.Run(proto, func(t *testing.T) {
			a, s := wsServer(t)
			tok := a.admin(t)
			inst := a.mustCreate(t, tok, createInput("one"))
			c := subscribeWS(t, s, proto, tok, subQuery("acme", ""))
			if first := c.event(); first.Kind != "SNAPSHOT" {
				t.Fatalf("first event %+v", first)
			}
			snap := c.synced()
			c.quiet(100 * time.Millisecond)
			c.stop()

			// Three changes while disconnected: two updates and a new instance.
			a.describe(t, tok, inst.ID, "a")
			a.describe(t, tok, inst.ID, "b")
			other := a.mustCreate(t, tok, createInput("two"))

			c = subscribeWS(t, s, proto, tok, subQuery("acme", snap.Cursor))
			want := []struct{ kind, id string }{{"UPDATED", inst.ID}, {"UPDATED", inst.ID}, {"CREATED", other.ID}}
			cursors := map[string]bool{snap.Cursor: true}
			var last subEvent
			for i, w := range want {
				ev := c.event()
				if ev.Kind != w.kind || ev.Instance.ID != w.id {
					t.Fatalf("replayed event %d: %s %s, want %s %s", i, ev.Kind, ev.Instance.ID, w.kind, w.id)
				}
				if cursors[ev.Cursor] {
					t.Errorf("replayed event %d repeats cursor %q", i, ev.Cursor)
				}
				cursors[ev.Cursor] = true
				last = ev
			}
			if last.Instance.Generation != 1 {
				t.Errorf("created instance generation %d", last.Instance.Generation)
			}
			c.quiet(silence)

			a.describe(t, tok, other.ID, "live")
			ev := c.event()
			if ev.Kind != "UPDATED" || ev.Instance.ID != other.ID || cursors[ev.Cursor] {
				t.Errorf("live event after the replay %+v", ev)
			}
			c.quiet(silence)
		})
	}
}

// TestSubscriptionCursorExpired: a cursor older than the retained log is CURSOR_EXPIRED.
func TestSubscriptionCursorExpired(t *testing.T) {
	for _, proto := range wsProtocols {
		t.Run(proto, func(t *testing.T) {
			a, s := wsServer(t)
			tok := a.admin(t)
			inst := a.mustCreate(t, tok, createInput("one"))
			c := subscribeWS(t, s, proto, tok, subQuery("acme", ""))
			old := c.event().Cursor
			c.stop()
			for i := range 4 {
				a.describe(t, tok, inst.ID, fmt.Sprint(i))
			}
			if err := a.rdb.XTrimMaxLen(context.Background(), "cq:{o:acme}:events", 1).Err(); err != nil {
				t.Fatal(err)
			}
			c = subscribeWS(t, s, proto, tok, subQuery("acme", old))
			codes, m := c.opErrorCodes()
			if !reflect.DeepEqual(codes, []string{"CURSOR_EXPIRED"}) {
				t.Errorf("codes %q, want [CURSOR_EXPIRED]; message %s %s", codes, m.Type, m.Payload)
			}
			if !strings.Contains(string(m.Payload), "snapshot") {
				t.Errorf("the error does not tell the client to start over: %s", m.Payload)
			}
		})
	}
}

// TestSubscriptionIsolation: another organization's subscriber cannot subscribe to acme and
// never sees its events; a project-scoped viewer sees only its project's instances.
func TestSubscriptionIsolation(t *testing.T) {
	for _, proto := range wsProtocols {
		t.Run(proto, func(t *testing.T) {
			a, s := wsServer(t)
			tok := a.admin(t)
			web := a.mustCreate(t, tok, createInput("web1"))
			data := a.mustCreate(t, tok, with("data1", map[string]any{"projectId": "data", "networkId": "net-acme-data-eu"}))
			globexInput := with("g1", map[string]any{"organizationId": "globex", "projectId": "prod", "networkId": "net-globex-prod-eu"})
			g := a.mustCreate(t, tok, globexInput)

			globex := a.token(t, "gus", auth.Grant{OrganizationID: "globex", Role: auth.RoleAdmin})
			c := subscribeWS(t, s, proto, globex, subQuery("acme", ""))
			if codes, m := c.opErrorCodes(); !reflect.DeepEqual(codes, []string{"NOT_FOUND"}) {
				t.Errorf("globex subscribing to acme: codes %q, message %s %s", codes, m.Type, m.Payload)
			}

			gsub := subscribeWS(t, s, proto, globex, subQuery("globex", ""))
			if ev := gsub.event(); ev.Kind != "SNAPSHOT" || ev.Instance.ID != g.ID {
				t.Fatalf("globex snapshot %+v", ev)
			}
			gsub.synced() // exactly one snapshot
			gsub.quiet(100 * time.Millisecond)

			viewer := a.token(t, "vera", auth.Grant{OrganizationID: "acme", ProjectID: "data", Role: auth.RoleViewer})
			vsub := subscribeWS(t, s, proto, viewer, subQuery("acme", ""))
			if ev := vsub.event(); ev.Kind != "SNAPSHOT" || ev.Instance.ID != data.ID {
				t.Fatalf("viewer snapshot %+v, want only %s", ev, data.ID)
			}
			vsub.synced()
			vsub.quiet(100 * time.Millisecond)

			// acme/web changes: neither subscriber hears of them.
			a.describe(t, tok, web.ID, "x")
			a.mustCreate(t, tok, createInput("web2"))
			a.mustDelete(t, tok, web.ID)
			gsub.quiet(silence)
			vsub.quiet(silence)

			// An acme/data change reaches the viewer (first: nothing of web was queued before
			// it), and still not globex.
			a.describe(t, tok, data.ID, "y")
			if ev := vsub.event(); ev.Kind != "UPDATED" || ev.Instance.ID != data.ID {
				t.Errorf("viewer got %+v, want the data instance's update", ev)
			}
			gsub.quiet(silence)
			// The globex subscriber was live all along.
			a.describe(t, tok, g.ID, "z")
			if ev := gsub.event(); ev.Kind != "UPDATED" || ev.Instance.ID != g.ID {
				t.Errorf("globex got %+v, want its own update", ev)
			}
			vsub.quiet(silence / 2)
		})
	}
}

// TestSubscriptionSSE: the subscription over SSE delivers the snapshot, then live events.
func TestSubscriptionSSE(t *testing.T) {
	a, s := wsServer(t)
	tok := a.admin(t)
	inst := a.mustCreate(t, tok, createInput("one"))
	res := ssePost(t, s, tok, subQuery("acme", ""))
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, Content-Type %q", res.StatusCode, res.Header.Get("Content-Type"))
	}
	events := make(chan sseEvent, 16)
	go func() {
		defer close(events)
		var cur sseEvent
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if cur != (sseEvent{}) {
					events <- cur
				}
				cur = sseEvent{}
			case strings.HasPrefix(line, "event:"):
				cur.Event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
			case strings.HasPrefix(line, "data:"):
				cur.Data += strings.TrimSpace(strings.TrimPrefix(line, "data:"))
			}
		}
	}()
	next := func() subEvent {
		t.Helper()
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatal("stream ended")
			}
			if e.Event != "next" {
				t.Fatalf("event %+v, want next", e)
			}
			var r gqlResponse
			if err := json.Unmarshal([]byte(e.Data), &r); err != nil {
				t.Fatal(err)
			}
			if len(r.Errors) > 0 {
				t.Fatalf("errors: %s", e.Data)
			}
			var ev subEvent
			decode(t, r.Data["instanceEvents"], &ev)
			return ev
		case <-time.After(5 * time.Second):
			t.Fatal("no event within 5s")
		}
		return subEvent{}
	}
	if ev := next(); ev.Kind != "SNAPSHOT" || ev.Instance.ID != inst.ID {
		t.Fatalf("first event %+v", ev)
	}
	if ev := next(); ev.Kind != "SYNCED" {
		t.Fatalf("second event %+v, want SYNCED", ev)
	}
	a.describe(t, tok, inst.ID, "sse")
	if ev := next(); ev.Kind != "UPDATED" || ev.Instance.ID != inst.ID || !reflect.DeepEqual(ev.ChangedFields, []string{"description"}) {
		t.Errorf("live event %+v", ev)
	}
}

// TestSubscriptionTwoProcesses: two API processes on one Redis each deliver a change made
// through either to their own subscribers.
func TestSubscriptionTwoProcesses(t *testing.T) {
	a, sa := wsServer(t)
	b := apiOn(t, a.rdb, feed.Options{})
	sb := serveAPI(t, b)
	tok := a.admin(t)
	inst := a.mustCreate(t, tok, createInput("one"))
	ca := subscribeWS(t, sa, protoTransportWS, tok, subQuery("acme", ""))
	cb := subscribeWS(t, sb, protoLegacyWS, tok, subQuery("acme", ""))
	for _, c := range []*wsClient{ca, cb} {
		if ev := c.event(); ev.Kind != "SNAPSHOT" || ev.Instance.ID != inst.ID {
			t.Fatalf("snapshot %+v", ev)
		}
		c.synced()
	}
	a.describe(t, tok, inst.ID, "via a")
	b.describe(t, tok, inst.ID, "via b")
	for name, c := range map[string]*wsClient{"a": ca, "b": cb} {
		for _, want := range []int{inst.Generation + 1, inst.Generation + 2} {
			if ev := c.event(); ev.Kind != "UPDATED" || ev.Instance.ID != inst.ID || ev.Instance.Generation != want {
				t.Errorf("subscriber of %s: %+v, want generation %d", name, ev, want)
			}
		}
		c.quiet(silence / 2)
	}
}

// TestSubscriptionNoGoroutineLeak: opening and closing many subscriptions leaves no goroutine
// behind.
func TestSubscriptionNoGoroutineLeak(t *testing.T) {
	const n = 200
	// It opens 200 sockets and subscriptions as one principal.
	a, s := wsServer(t, func(o *Options) { o.RateLimit, o.MaxSocketsPerPrincipal, o.MaxSubscriptionsPerPrincipal = -1, n, n })
	tok := a.admin(t)
	a.mustCreate(t, tok, createInput("one"))
	// The baseline is taken once what the create left running (connections, the feed) has
	// settled: two readings in a row agree.
	base := runtime.NumGoroutine()
	eventually.Holds(t, 10*time.Second, func() bool {
		prev := base
		base = runtime.NumGoroutine()
		return base == prev
	}, "the goroutine count did not settle")
	clients := make([]*wsClient, n)
	for i := range clients {
		clients[i] = subscribeWS(t, s, protoTransportWS, tok, subQuery("acme", ""))
	}
	for _, c := range clients {
		if ev := c.event(); ev.Kind != "SNAPSHOT" {
			t.Fatalf("first event %+v", ev)
		}
	}
	// Each subscription shows in the count (its client's reader, at least); a short-lived
	// goroutine of the baseline (a pooled connection's, a timer's) may have ended meanwhile.
	if g := runtime.NumGoroutine(); g < base+n-n/20 {
		t.Fatalf("%d goroutines with %d subscriptions open, baseline %d: the test measures nothing", g, n, base)
	}
	for _, c := range clients {
		c.stop()
	}
	eventually.Holds(t, 10*time.Second, func() bool { return runtime.NumGoroutine() <= base },
		"goroutines after closing %d subscriptions, baseline %d:\n%s", n, base, eventually.Lazy(func() string {
			buf := make([]byte, 1<<20)
			return string(buf[:runtime.Stack(buf, true)])
		}))
}

// smallBufferListener shrinks accepted connections' send buffers, so a client that does not
// read blocks the server's writes after a few kilobytes.
type smallBufferListener struct{ net.Listener }

func (l smallBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4096)
	}
	return c, err
}

// TestSubscriptionSlowConsumer: a subscriber that does not read is cut off once its feed
// buffer fills, with an error telling it to resubscribe, while a reading subscriber on the
// same process gets every event.
func TestSubscriptionSlowConsumer(t *testing.T) {
	const changes = 80
	a0 := newAPI(t)
	a := apiOn(t, a0.rdb, feed.Options{Buffer: 4})
	s := httptest.NewUnstartedServer(a.handler)
	s.Listener = smallBufferListener{s.Listener}
	s.Start()
	t.Cleanup(s.Close)
	tok := a.admin(t)
	inst := a.mustCreate(t, tok, createInput("one"))

	fast := subscribeWS(t, s, protoTransportWS, tok, subQuery("acme", ""))
	if ev := fast.event(); ev.Kind != "SNAPSHOT" {
		t.Fatalf("fast: %+v", ev)
	}
	fast.synced()

	// The slow client: a raw socket with a small receive buffer that reads only the ack.
	d := websocket.Dialer{Subprotocols: []string{protoTransportWS}, HandshakeTimeout: 5 * time.Second,
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetReadBuffer(4096)
			}
			return c, err
		}}
	slow, _, err := d.Dial(wsURL(s), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slow.Close() })
	slow.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := slow.WriteJSON(map[string]any{"type": "connection_init", "payload": map[string]any{"Authorization": "Bearer " + tok}}); err != nil {
		t.Fatal(err)
	}
	var ack wsMessage
	slow.SetReadDeadline(time.Now().Add(5 * time.Second))
	if err := slow.ReadJSON(&ack); err != nil || ack.Type != "connection_ack" {
		t.Fatalf("slow ack: %+v %v", ack, err)
	}
	if err := slow.WriteJSON(map[string]any{"type": "subscribe", "id": "s", "payload": map[string]any{"query": subQuery("acme", "")}}); err != nil {
		t.Fatal(err)
	}
	// It reads its snapshot and SYNCED (so it is live before the changes start), then nothing
	// more.
	var snapshot, synced wsMessage
	if err := slow.ReadJSON(&snapshot); err != nil || snapshot.Type != "next" || !strings.Contains(string(snapshot.Payload), `"SNAPSHOT"`) {
		t.Fatalf("slow snapshot: %s %s %v", snapshot.Type, snapshot.Payload, err)
	}
	if err := slow.ReadJSON(&synced); err != nil || synced.Type != "next" || !strings.Contains(string(synced.Payload), `"SYNCED"`) {
		t.Fatalf("slow SYNCED: %s %s %v", synced.Type, synced.Payload, err)
	}

	// Many changes; the fast subscriber receives every one, in order.
	for i := range changes {
		a.describe(t, tok, inst.ID, fmt.Sprintf("d%d", i))
		if ev := fast.event(); ev.Kind != "UPDATED" || ev.Instance.Generation != inst.Generation+1+i {
			t.Fatalf("fast subscriber, change %d: %+v", i, ev)
		}
	}
	fast.quiet(silence / 2)

	// The slow client now reads what was queued for it: the snapshot, the events that fit
	// in its buffers, then the error and complete.
	events, other := []wsMessage{snapshot}, []wsMessage(nil)
	slow.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		var m wsMessage
		if err := slow.ReadJSON(&m); err != nil {
			t.Fatalf("slow client after %d events, %d other messages (%+v): %v", len(events), len(other), other, err)
		}
		if m.Type == "ping" {
			continue
		}
		if m.Type == "next" && !strings.Contains(string(m.Payload), `"errors"`) {
			events = append(events, m)
			continue
		}
		other = append(other, m)
		if m.Type == "complete" {
			break
		}
	}
	t.Logf("slow client: %d events, then %d messages:", len(events), len(other))
	for _, m := range other {
		t.Logf("  %s %s %s", m.Type, m.ID, m.Payload)
	}
	if len(events) >= changes+1 {
		t.Fatalf("the slow client got all %d events: it was not cut off", len(events))
	}
	if last := other[len(other)-1]; last.Type != "complete" || last.ID != "s" {
		t.Errorf("the slow subscription did not end with complete: %+v", other)
	}
	if len(other) != 2 || other[0].Type != "next" || other[0].ID != "s" {
		t.Fatalf("the slow subscription did not end with one error then complete: %+v", other)
	}
	var ended gqlResponse
	if err := json.Unmarshal(other[0].Payload, &ended); err != nil {
		t.Fatal(err)
	}
	if codes := ended.codes(); len(codes) != 1 || codes[0] != "UNAVAILABLE" || !strings.Contains(ended.Errors[0].Message, "did not keep up") {
		t.Fatalf("the slow subscription's error: %+v", ended.Errors)
	}

	// What it did get is a gapless prefix: the snapshot, then consecutive changes; resuming
	// after the last cursor received brings exactly the rest.
	var last subEvent
	for i, m := range events {
		var res gqlResponse
		if err := json.Unmarshal(m.Payload, &res); err != nil {
			t.Fatal(err)
		}
		decode(t, res.Data["instanceEvents"], &last)
		if wantKind := map[bool]string{true: "SNAPSHOT", false: "UPDATED"}[i == 0]; last.Kind != wantKind || last.Instance.Generation != inst.Generation+i {
			t.Fatalf("slow client event %d: %+v", i, last)
		}
	}
	if after := ended.Errors[0].Extensions["after"]; after != last.Cursor {
		t.Fatalf("the error says resume after %v; the last event received was %s", after, last.Cursor)
	}
	resumed := subscribeWS(t, s, protoLegacyWS, tok, subQuery("acme", last.Cursor))
	for i := len(events); i <= changes; i++ {
		if ev := resumed.event(); ev.Kind != "UPDATED" || ev.Instance.Generation != inst.Generation+i {
			t.Fatalf("resumed after the cut: %+v, want generation %d", ev, inst.Generation+i)
		}
	}
	resumed.quiet(silence / 2)
}

// TestSubscriptionEndsWhenTokenExpires: a subscription lives as long as the token that opened
// it, clock skew included (the same rule as every request's). When it is over, the subscriber
// gets an UNAUTHENTICATED error carrying the cursor to resume after, then the end of the
// stream, on WebSocket and SSE alike.
func TestSubscriptionEndsWhenTokenExpires(t *testing.T) {
	a := newAPI(t)
	s := serveAPI(t, a)
	admin := a.admin(t)
	inst := a.mustCreate(t, admin, createInput("one"))
	// Expired 28 s ago, so honoured for 2 s more under the 30 s skew: enough to receive the
	// snapshot; the end of the token's life is what ends the wait.
	short := func(t *testing.T) string {
		tok, err := a.keys.Mint(auth.Principal{Subject: "brief", Grants: []auth.Grant{{OrganizationID: "acme", Role: auth.RoleViewer}}}, time.Now().Add(-30*time.Second), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}

	wantExpiry := func(t *testing.T, payload []byte, lastCursor string) {
		t.Helper()
		var res gqlResponse
		if err := json.Unmarshal(payload, &res); err != nil {
			t.Fatal(err)
		}
		if codes := res.codes(); len(codes) != 1 || codes[0] != "UNAUTHENTICATED" || !strings.Contains(res.Errors[0].Message, "expired") {
			t.Fatalf("want one UNAUTHENTICATED error saying the token expired, got %s", payload)
		}
		if after := res.Errors[0].Extensions["after"]; after != lastCursor {
			t.Fatalf("resume after %v, want the last cursor received %s", after, lastCursor)
		}
	}

	t.Run("websocket", func(t *testing.T) {
		c := subscribeWS(t, s, protoTransportWS, short(t), subQuery("acme", ""))
		if snap := c.event(); snap.Kind != "SNAPSHOT" || snap.Instance.ID != inst.ID {
			t.Fatalf("snapshot: %+v", snap)
		}
		synced := c.synced()
		m := c.next() // blocks until the server ends the subscription
		if m.Type != "next" || m.ID != "s" {
			t.Fatalf("got %s %s %s, want the expiry error", m.Type, m.ID, m.Payload)
		}
		wantExpiry(t, m.Payload, synced.Cursor)
		if m := c.next(); m.Type != "complete" || m.ID != "s" {
			t.Fatalf("got %s %s, want complete", m.Type, m.Payload)
		}
	})

	t.Run("sse", func(t *testing.T) {
		res := ssePost(t, s, short(t), subQuery("acme", ""))
		if res.StatusCode != http.StatusOK {
			t.Fatalf("status %d", res.StatusCode)
		}
		// readSSE returns when the server ends the stream; a stream that outlives its token
		// fails the test instead of hanging it.
		type read struct {
			events []sseEvent
			err    error
		}
		got := within(t, 10*time.Second, func() read { e, err := readSSE(res.Body); return read{e, err} })
		events, err := got.events, got.err
		if err != nil {
			t.Fatal(err)
		}
		if len(events) != 4 || events[0].Event != "next" || events[1].Event != "next" || events[2].Event != "next" || events[3].Event != "complete" {
			t.Fatalf("want snapshot, SYNCED, error, complete; got %+v", events)
		}
		var second gqlResponse
		if err := json.Unmarshal([]byte(events[1].Data), &second); err != nil {
			t.Fatal(err)
		}
		var synced subEvent
		decode(t, second.Data["instanceEvents"], &synced)
		if synced.Kind != "SYNCED" {
			t.Fatalf("second event %+v, want SYNCED", synced)
		}
		wantExpiry(t, []byte(events[2].Data), synced.Cursor)
	})
}

// TestWebSocketRefusesOperationsAfterTokenExpiry: a socket authenticates once, in
// connection_init, and its operations follow the one rule of every transport: a token is
// honoured until its exp plus the clock skew (30 s), so one that expired 10 s ago works over a
// socket as over HTTP; an operation sent after that is refused with UNAUTHENTICATED, though the
// socket stays open for a reconnect-free error.
func TestWebSocketRefusesOperationsAfterTokenExpiry(t *testing.T) {
	a := newAPI(t)
	s := serveAPI(t, a)
	viewer := auth.Principal{Subject: "late", Grants: []auth.Grant{{OrganizationID: "acme", Role: auth.RoleViewer}}}
	mint := func(expiredAgo time.Duration) string {
		tok, err := a.keys.Mint(viewer, time.Now().Add(-expiredAgo-time.Minute), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	withinSkew := mint(10 * time.Second)
	if res := a.post(t, withinSkew, `{ me { subject } }`, nil); len(res.Errors) > 0 {
		t.Fatalf("HTTP refused a token within the skew: %s", res.Raw)
	}
	// Honoured for one more second: accepted at connection_init, over by the operation.
	lapsing := mint(29 * time.Second)
	deadline := time.Now().Add(time.Second)
	for _, tc := range []struct {
		name  string
		token string
		wait  bool
		want  []string
	}{
		{"expired within the skew", withinSkew, false, nil},
		{"past exp plus the skew by the operation", lapsing, true, []string{"UNAUTHENTICATED"}},
		{"fresh", a.admin(t), false, nil},
	} {
		c := mustDialWS(t, wsURL(s), protoTransportWS, wsDial{})
		c.mustAck(tc.token)
		if tc.wait {
			// The token's life is a moment on the clock: waiting for it is the event.
			time.Sleep(time.Until(deadline.Add(100 * time.Millisecond)))
		}
		c.start("q", `{ me { subject } }`)
		codes, m := c.opErrorCodes()
		if !slices.Equal(codes, tc.want) {
			t.Errorf("%s: codes %v (%s), want %v", tc.name, codes, m.Payload, tc.want)
		}
		c.conn.Close()
	}
}

// TestSubscriptionVariablesReadPerEvent: a subscription's variables that its selection reads
// (here @include) still decide every live event, while those only its field's arguments read
// are let go once it has begun: both shapes go on delivering as asked.
func TestSubscriptionVariablesReadPerEvent(t *testing.T) {
	a, s := wsServer(t)
	tok := a.admin(t)
	one := a.mustCreate(t, tok, createInput("one"))
	const query = `subscription($org: ID!, $id: ID, $withName: Boolean!) {
		instanceEvents(organizationId: $org, instanceId: $id) { cursor kind changedFields instance { id name @include(if: $withName) generation } } }`
	subscribe := func(withName bool) *wsClient {
		c := mustDialWS(t, wsURL(s), protoTransportWS, wsDial{})
		c.mustAck(tok)
		c.send(map[string]any{"type": "subscribe", "id": "s", "payload": map[string]any{"query": query,
			"variables": map[string]any{"org": "acme", "id": one.ID, "withName": withName}}})
		if ev := c.event(); ev.Kind != "SNAPSHOT" {
			t.Fatalf("first event %+v, want SNAPSHOT", ev)
		}
		c.synced()
		return c
	}
	named, unnamed := subscribe(true), subscribe(false)
	for i := range 2 {
		a.describe(t, tok, one.ID, fmt.Sprint("live ", i))
		if ev := named.event(); ev.Kind != "UPDATED" || ev.Instance.ID != one.ID || ev.Instance.Name != "one" {
			t.Errorf("event %d with $withName true: %+v, want UPDATED of %s with its name", i, ev, one.ID)
		}
		if ev := unnamed.event(); ev.Kind != "UPDATED" || ev.Instance.ID != one.ID || ev.Instance.Name != "" {
			t.Errorf("event %d with $withName false: %+v, want UPDATED of %s without its name", i, ev, one.ID)
		}
	}
}
