package server

import (
	"encoding/json"
	"reflect"
	"testing"
)

// costOf is the extensions.cost of an answer.
type costOf struct {
	RequestedQueryCost int `json:"requestedQueryCost"`
	MaximumQueryCost   int `json:"maximumQueryCost"`
	ThrottleStatus     *struct {
		MaximumAvailable   int     `json:"maximumAvailable"`
		CurrentlyAvailable int     `json:"currentlyAvailable"`
		RestoreRate        float64 `json:"restoreRate"`
	} `json:"throttleStatus"`
}

// TestQueryCostInEveryAnswer: a query's and a mutation's answers carry extensions.cost, with
// the operation's complexity, the limit, and the caller's rate-limit bucket as it stands after
// the operation took its share (one per top-level field); a refusal for complexity carries it
// too; without a rate limit there is no bucket to show.
func TestQueryCostInEveryAnswer(t *testing.T) {
	clock := newTestClock()
	a := newAPI(t, func(o *Options) { o.RateLimit, o.RateBurst, o.now, o.MaxComplexity = 2, 10, clock.now, 50 })
	tok := a.admin(t)
	cost := func(t *testing.T, doc string) costOf {
		t.Helper()
		res := a.post(t, tok, doc, nil)
		var c costOf
		decode(t, res.Extensions["cost"], &c)
		return c
	}
	first := cost(t, `{ me { subject } }`)
	if first.RequestedQueryCost != 2 || first.MaximumQueryCost != 50 || first.ThrottleStatus == nil ||
		first.ThrottleStatus.MaximumAvailable != 10 || first.ThrottleStatus.CurrentlyAvailable != 9 || first.ThrottleStatus.RestoreRate != 2 {
		t.Errorf("first query: %+v %+v, want cost 2 of 50, 9 of 10 left restoring 2/s", first, first.ThrottleStatus)
	}
	// Two top-level fields take two.
	if c := cost(t, `{ me { subject } again: me { subject } }`); c.RequestedQueryCost != 4 || c.ThrottleStatus.CurrentlyAvailable != 7 {
		t.Errorf("two fields: %+v %+v, want cost 4 and 7 left", c, c.ThrottleStatus)
	}
	clock.advance(1000 * 1000 * 1000) // one second: two come back
	if c := cost(t, `{ me { subject } }`); c.ThrottleStatus.CurrentlyAvailable != 8 {
		t.Errorf("a second later: %d left, want 8", c.ThrottleStatus.CurrentlyAvailable)
	}
	if c := cost(t, `mutation { setQuota(input: {organizationId: "acme", limits: [{kind: "servers", limit: 5}]}) { userErrors { code } } }`); c.RequestedQueryCost == 0 || c.ThrottleStatus == nil {
		t.Errorf("mutation: %+v, want its cost", c)
	}
	over := a.post(t, tok, `{ instances(organizationId: "acme", first: 100) { edges { node { id } } } }`, nil)
	wantError(t, over, 200, "COMPLEXITY_LIMIT_EXCEEDED")
	var c costOf
	decode(t, over.Extensions["cost"], &c)
	if c.RequestedQueryCost <= 50 || c.MaximumQueryCost != 50 {
		t.Errorf("refused for complexity: %+v, want its cost over 50", c)
	}

	unlimited := newAPI(t, func(o *Options) { o.RateLimit = -1 })
	res := unlimited.post(t, unlimited.admin(t), `{ me { subject } }`, nil)
	var u costOf
	decode(t, res.Extensions["cost"], &u)
	if u.RequestedQueryCost != 2 || u.ThrottleStatus != nil {
		t.Errorf("without a rate limit: %+v, want cost 2 and no throttleStatus", u)
	}
	if !reflect.DeepEqual(a.mustPost(t, tok, `{ me { subject } }`, nil).Data["me"], map[string]any{"subject": "admin"}) {
		t.Error("the answer itself changed")
	}
}

// TestSubscriptionComplexityLimit: a subscription is held to the complexity limit as a query
// is (though its answers carry no cost).
func TestSubscriptionComplexityLimit(t *testing.T) {
	a, s := wsServer(t, func(o *Options) { o.MaxComplexity = 3 })
	tok := a.admin(t)
	c := mustDialWS(t, wsURL(s), protoTransportWS, wsDial{})
	c.mustAck(tok)
	c.raw(`{"type":"subscribe","id":"over","payload":{"query":"subscription { instanceEvents(organizationId: \"acme\") { kind cursor changedFields } }"}}`)
	m := c.next()
	var errs []struct {
		Extensions map[string]any `json:"extensions"`
	}
	if m.Type != "error" || m.ID != "over" || json.Unmarshal(m.Payload, &errs) != nil || len(errs) != 1 || errs[0].Extensions["code"] != "COMPLEXITY_LIMIT_EXCEEDED" {
		t.Fatalf("over the limit: %+v %s, want an error COMPLEXITY_LIMIT_EXCEEDED", m, m.Payload)
	}
	c.raw(`{"type":"subscribe","id":"s","payload":{"query":"subscription { instanceEvents(organizationId: \"acme\") { kind } }"}}`)
	if ev := c.event(); ev.Kind != "SYNCED" {
		t.Fatalf("within the limit: first event %+v, want SYNCED", ev)
	}
}
