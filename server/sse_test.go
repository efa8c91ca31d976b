package server

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
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

	raw, err := io.ReadAll(sseGet(t, s.URL, tok, `query($id: ID!) { instance(id: $id) { name } }`, map[string]any{"id": inst.ID}).Body)
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
