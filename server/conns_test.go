package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/metrictest"
)

// limitedServer serves the API with small connection limits and the registry to read their
// refusals from.
func limitedServer(t *testing.T, edit func(*Options)) (*api, string, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	a, s := wsServer(t, func(o *Options) {
		o.Registry, o.RateLimit = reg, -1
		edit(o)
	})
	return a, wsURL(s), reg
}

func refusals(t *testing.T, reg *prometheus.Registry, limit string) float64 {
	t.Helper()
	return metrictest.Value(t, reg, "computeql_connection_limit_refusals_total", "limit", limit)
}

// One principal holds at most MaxSocketsPerPrincipal sockets: the next connection_init closes
// with 4429, another principal is unaffected, and a closed socket frees its place.
func TestSocketsPerPrincipal(t *testing.T) {
	a, url, reg := limitedServer(t, func(o *Options) { o.MaxSocketsPerPrincipal = 2 })
	alice := a.token(t, "alice", auth.Grant{OrganizationID: "acme", Role: auth.RoleViewer})
	bob := a.token(t, "bob", auth.Grant{OrganizationID: "acme", Role: auth.RoleViewer})
	var held []*wsClient
	for range 2 {
		c := mustDialWS(t, url, protoTransportWS, wsDial{})
		c.mustAck(alice)
		held = append(held, c)
	}
	third := mustDialWS(t, url, protoTransportWS, wsDial{})
	third.init(map[string]any{"authToken": alice})
	_, err := third.closed(5 * time.Second)
	wantClose(t, err, CloseTooManyConnections, "Too many connections")
	if n := refusals(t, reg, limitPrincipalSockets); n != 1 {
		t.Errorf("%v refusals counted, want 1", n)
	}
	mustDialWS(t, url, protoTransportWS, wsDial{}).mustAck(bob)

	held[0].conn.Close()
	<-held[0].done
	// The server learns of the close on its own time: dial until it has.
	eventually.Holds(t, 10*time.Second, func() bool {
		c := mustDialWS(t, url, protoTransportWS, wsDial{})
		defer c.conn.Close()
		c.init(map[string]any{"authToken": alice})
		select {
		case m := <-c.msgs:
			return m.Type == "connection_ack"
		case <-c.done: // refused with 4429 still
			return false
		}
	}, "a socket of alice accepted again after she closed one")
}

// The process holds at most MaxSockets sockets: the next handshake is refused with 429 and
// Retry-After, before any upgrade.
func TestSocketsPerProcess(t *testing.T) {
	a, url, reg := limitedServer(t, func(o *Options) { o.MaxSockets = 2 })
	tok := a.admin(t)
	for range 2 {
		mustDialWS(t, url, protoTransportWS, wsDial{}).mustAck(tok)
	}
	_, resp, err := dialWS(t, url, protoTransportWS, wsDial{})
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third handshake: %v, %+v; want 429 with Retry-After", err, resp)
	}
	if n := refusals(t, reg, limitProcessSockets); n != 1 {
		t.Errorf("%v refusals counted, want 1", n)
	}
}

// One socket runs at most MaxSubscriptionsPerSocket subscriptions, and one principal at most
// MaxSubscriptionsPerPrincipal over all its sockets: the next is refused with RATE_LIMITED,
// and a stopped one frees its place.
func TestSubscriptionsPerSocketAndPrincipal(t *testing.T) {
	a, url, reg := limitedServer(t, func(o *Options) { o.MaxSubscriptionsPerSocket, o.MaxSubscriptionsPerPrincipal = 2, 3 })
	tok := a.admin(t)
	a.mustCreate(t, tok, createInput("one"))
	sub := func(c *wsClient, id string) {
		t.Helper()
		c.start(id, subQuery("acme", ""))
		for _, want := range []string{"SNAPSHOT", "SYNCED"} {
			if m := c.next(); m.ID != id || m.Type != "next" || !strings.Contains(string(m.Payload), want) {
				t.Fatalf("subscription %s: %s %s, want its %s", id, m.Type, m.Payload, want)
			}
		}
	}
	refused := func(c *wsClient, id string) {
		t.Helper()
		c.start(id, subQuery("acme", ""))
		if codes, m := c.opErrorCodes(); !slices.Equal(codes, []string{"RATE_LIMITED"}) || m.ID != id {
			t.Fatalf("subscription %s: codes %v (%s), want RATE_LIMITED", id, codes, m.Payload)
		}
	}
	first := mustDialWS(t, url, protoTransportWS, wsDial{})
	first.mustAck(tok)
	sub(first, "a")
	sub(first, "b")
	refused(first, "c")
	if n := refusals(t, reg, limitSocketSubscriptions); n != 1 {
		t.Errorf("%v per-socket refusals counted, want 1", n)
	}

	second := mustDialWS(t, url, protoTransportWS, wsDial{})
	second.mustAck(tok)
	sub(second, "d")
	refused(second, "e")
	if n := refusals(t, reg, limitPrincipalSubscriptions); n != 1 {
		t.Errorf("%v per-principal refusals counted, want 1", n)
	}

	first.send(map[string]any{"type": "complete", "id": "a"})
	// The stop is handled on the server's own time: try until a subscription is accepted.
	attempt := 0
	eventually.Holds(t, 10*time.Second, func() bool {
		attempt++
		id := fmt.Sprint("f", attempt)
		second.start(id, subQuery("acme", ""))
		for {
			m := second.next()
			if m.ID != id || m.Type == "complete" {
				continue
			}
			var res struct {
				Errors []any `json:"errors"`
			}
			return m.Type == "next" && json.Unmarshal(m.Payload, &res) == nil && len(res.Errors) == 0
		}
	}, "a subscription accepted once one was stopped")
}
