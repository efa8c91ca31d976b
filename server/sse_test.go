package server

import (
	"bufio"
	"cmp"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/redistest"
)

// sseGet GETs an operation asking for an event stream, the way a client that can only GET
// (an EventSource polyfill that sets headers) does.
func sseGet(t *testing.T, base, token, query string, vars map[string]any) *http.Response {
	t.Helper()
	q := url.Values{"query": {query}}
	if vars != nil {
		b, _ := json.Marshal(vars)
		q.Set("variables", string(b))
	}
	req, err := http.NewRequest(http.MethodGet, base+"/graphql?"+q.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	return res
}

// TestSSEOverGET: a query and a subscription stream over GET as over POST, a mutation is
// refused in the stream, and every stream's complete event has a data line, without which an
// EventSource never fires it.
func TestSSEOverGET(t *testing.T) {
	a, s := wsServer(t)
	tok := a.admin(t)
	inst := a.mustCreate(t, tok, createInput("one"))

	res := sseGet(t, s.URL, tok, `query($id: ID!) { instance(id: $id) { name } }`, map[string]any{"id": inst.ID})
	if vary := res.Header.Get("Vary"); vary != "Accept" {
		t.Errorf("Vary %q: the same GET is answered as JSON without the event stream in Accept", vary)
	}
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `{"instance":{"name":"one"}}`) || !strings.HasSuffix(string(raw), "event: complete\ndata:\n\n") {
		t.Errorf("query over GET: %q, want its result, then complete with a data line", raw)
	}

	raw, _ = io.ReadAll(sseGet(t, s.URL, tok, `mutation { setQuota(input: {organizationId: "acme", limits: []}) { quota { organizationId } } }`, nil).Body)
	if !strings.Contains(string(raw), "GRAPHQL_VALIDATION_FAILED") || strings.Contains(string(raw), `"quota"`) {
		t.Errorf("mutation over GET: %q, want it refused", raw)
	}

	sub := bufio.NewReader(sseGet(t, s.URL, tok, subQuery("acme", ""), nil).Body)
	next := func() string {
		t.Helper()
		for {
			line, err := sub.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				return data
			}
		}
	}
	for _, want := range []string{`"SNAPSHOT"`, `"SYNCED"`} {
		if got := next(); !strings.Contains(got, want) {
			t.Fatalf("subscription over GET: %s, want %s", got, want)
		}
	}
	a.describe(t, tok, inst.ID, "over GET")
	if got := next(); !strings.Contains(got, `"UPDATED"`) || !strings.Contains(got, inst.ID) {
		t.Fatalf("live event over GET: %s", got)
	}
}

// TestStreamTickets: a stream ticket opens one event stream over GET without any header but
// Accept, as a browser's EventSource sends it, as the principal that asked for it; a second
// use, an unknown ticket, and a ticket anywhere but an event-stream GET are refused with 401.
func TestStreamTickets(t *testing.T) {
	a, s := wsServer(t)
	tok := a.admin(t)
	a.mustCreate(t, tok, createInput("one"))
	ticket := func() string {
		t.Helper()
		res := a.mustPost(t, tok, `mutation { createStreamTicket { ticket expiresAt } }`, nil)
		var got struct {
			Ticket    string    `json:"ticket"`
			ExpiresAt time.Time `json:"expiresAt"`
		}
		decode(t, res.Data["createStreamTicket"], &got)
		if len(got.Ticket) < 40 || time.Until(got.ExpiresAt) > time.Minute || time.Until(got.ExpiresAt) < 50*time.Second {
			t.Fatalf("ticket %+v, want a long random one for about a minute", got)
		}
		return got.Ticket
	}
	// open GETs the query with the ticket, the Accept header and any other headers, given as
	// name and value.
	open := func(ticket, accept, query string, headers ...string) *http.Response {
		t.Helper()
		q := url.Values{"query": {query}, "ticket": {ticket}}
		req, _ := http.NewRequest(http.MethodGet, s.URL+"/graphql?"+q.Encode(), nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { res.Body.Close() })
		return res
	}

	first := ticket()
	res := open(first, "text/event-stream", subQuery("acme", ""))
	if res.StatusCode != http.StatusOK {
		t.Fatalf("stream with a ticket: %d", res.StatusCode)
	}
	sub := bufio.NewReader(res.Body)
	for _, want := range []string{`"SNAPSHOT"`, `"SYNCED"`} {
		for {
			line, err := sub.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				if !strings.Contains(data, want) {
					t.Fatalf("stream with a ticket: %s, want %s", data, want)
				}
				break
			}
		}
	}
	unspent := ticket()
	calls := &redistest.RoundTrips{}
	a.rdb.AddHook(calls)
	for _, tt := range []struct {
		name       string
		res        func() *http.Response
		roundTrips int64 // to Redis, besides the request log's none
	}{
		{"the same ticket again", func() *http.Response { return open(first, "text/event-stream", subQuery("acme", "")) }, 1},
		{"an unknown ticket", func() *http.Response {
			return open(strings.Repeat("A", len(first)), "text/event-stream", subQuery("acme", ""))
		}, 1},
		{"not a ticket at all", func() *http.Response { return open("not-a-ticket", "text/event-stream", subQuery("acme", "")) }, 0},
		{"a plain GET", func() *http.Response { return open(unspent, "application/json", `{ me { subject } }`) }, 0},
		{"a GET that lists JSON before the event stream", func() *http.Response {
			return open(unspent, "application/json, text/event-stream", `{ me { subject } }`)
		}, 0},
		{"a GET that asks for a WebSocket", func() *http.Response {
			return open(unspent, "text/event-stream", subQuery("acme", ""), "Upgrade", "websocket")
		}, 0},
	} {
		before := calls.N()
		if r := tt.res(); r.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", tt.name, r.StatusCode)
		}
		if n := calls.N() - before; n != tt.roundTrips {
			t.Errorf("%s: %d round trips to Redis, want %d", tt.name, n, tt.roundTrips)
		}
	}
	// The ticket no plain GET could spend still opens its stream.
	if res := open(unspent, "text/event-stream", subQuery("acme", "")); res.StatusCode != http.StatusOK {
		t.Errorf("the ticket a plain GET was sent with: %d", res.StatusCode)
	}
}

// TestSSEOnlyWhenPreferred: an event stream answers only a request whose Accept prefers it to
// JSON, by q and then by order, case-insensitively; one that merely lists it after JSON (as urql
// does) gets JSON.
func TestSSEOnlyWhenPreferred(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	for _, tt := range []struct {
		accept, want string
		contentType  string // application/json when empty
	}{
		{accept: "text/event-stream", want: "text/event-stream"},
		{accept: "text/event-stream, application/json", want: "text/event-stream"},
		{accept: "application/graphql-response+json, application/graphql+json, application/json, text/event-stream, multipart/mixed", want: mediaGraphQLResponse},
		{accept: "application/json, text/event-stream", want: mediaJSON},
		{accept: "application/json;q=0.5, text/event-stream", want: "text/event-stream"},
		{accept: "text/event-stream;q=0.2, application/json", want: mediaJSON},
		// Media types are case-insensitive.
		{accept: "Text/Event-Stream", want: "text/event-stream", contentType: "Application/JSON"},
	} {
		req := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(`{"query":"{ me { subject } }"}`))
		req.Header.Set("Content-Type", cmp.Or(tt.contentType, "application/json"))
		req.Header.Set("Accept", tt.accept)
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := a.serve(req)
		if got, _, _ := strings.Cut(rec.Header().Get("Content-Type"), ";"); got != tt.want {
			t.Errorf("Accept %q: answered %s (%d), want %s", tt.accept, got, rec.Code, tt.want)
		}
	}
}

// TestSSEStreamsTheBodyAsRead: gqlgen's SSE transport matches a body's keys in any letter
// case and echoes back whole a body it cannot take; it is given the request as this server
// read it (keys matched exactly, as the POST transport does), so a stray "Query" beside
// "query" neither fails the stream nor comes back in it.
func TestSSEStreamsTheBodyAsRead(t *testing.T) {
	a, s := wsServer(t)
	tok := a.admin(t)
	body := `{"query": "{ me { subject } }", "Query": 1, "variables": {"unused": 12345678901234567890}}`
	req, err := http.NewRequest(http.MethodPost, s.URL+"/graphql", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"me":{"subject":`) || strings.Contains(string(raw), `"Query"`) {
		t.Errorf("status %d, %q: want the query's result streamed, and no echo of the body", res.StatusCode, raw)
	}
}

// TestSSERefusalsHaveNoData: an operation refused before it ran is a next event without a
// data entry, over POST and GET alike, as it is over plain POST; the stream still completes.
func TestSSERefusalsHaveNoData(t *testing.T) {
	a, s := wsServer(t)
	tok := a.admin(t)
	for name, res := range map[string]*http.Response{
		"POST, not valid":    ssePost(t, s, tok, `{ nope }`),
		"POST, not parsed":   ssePost(t, s, tok, `{ me {`),
		"GET, a mutation":    sseGet(t, s.URL, tok, `mutation { createStreamTicket { ticket } }`, nil),
		"GET, unknown field": sseGet(t, s.URL, tok, `{ nope }`, nil),
	} {
		events, err := readSSE(res.Body)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(events) != 2 || events[0].Event != "next" || events[1].Event != "complete" {
			t.Fatalf("%s: events %+v, want next then complete", name, events)
		}
		var body map[string]json.RawMessage
		if err := json.Unmarshal([]byte(events[0].Data), &body); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, ok := body["data"]; ok || body["errors"] == nil {
			t.Errorf("%s: %s, want errors and no data entry", name, events[0].Data)
		}
	}
}

// TestSSEKeepAlive: a stream silent for KeepAliveInterval gets a comment, so that proxies do
// not close it, and goes on delivering events after.
func TestSSEKeepAlive(t *testing.T) {
	a, s := wsServer(t, func(o *Options) { o.KeepAliveInterval = 20 * time.Millisecond })
	tok := a.admin(t)
	inst := a.mustCreate(t, tok, createInput("quiet"))
	sub := bufio.NewReader(ssePost(t, s, tok, subQuery("acme", "")).Body)
	// Bounded, so that a stream without keep-alives fails the test rather than stalling it.
	read := func(want string) {
		t.Helper()
		err := within(t, verbLimit, func() error {
			for {
				line, err := sub.ReadString('\n')
				if err != nil || strings.Contains(line, want) {
					return err
				}
			}
		})
		if err != nil {
			t.Fatalf("waiting for %q: %v", want, err)
		}
	}
	read(`"SYNCED"`)
	read(": ping")
	read(": ping")
	a.describe(t, tok, inst.ID, "after the pings")
	read(`"UPDATED"`)
}
