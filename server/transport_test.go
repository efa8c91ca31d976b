package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// TestGETRunsQueries: GET /graphql?query=… runs a query with its variables.
func TestGETRunsQueries(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	inst := a.mustCreate(t, tok, createInput("over-get"))

	res := a.get(t, tok, `{ me { subject } }`, nil)
	if res.Status != http.StatusOK || len(res.Errors) > 0 || !reflect.DeepEqual(res.Data, map[string]any{"me": map[string]any{"subject": "mia"}}) {
		t.Errorf("GET me: %d %s", res.Status, res.Raw)
	}
	if ct, vary := res.Header.Get("Content-Type"), res.Header.Get("Vary"); ct != "application/json" || vary != "Accept" {
		t.Errorf("Content-Type %q, Vary %q; want application/json, Accept", ct, vary)
	}
	res = a.get(t, tok, `query($id: ID!) { instance(id: $id) { name } }`, map[string]any{"id": inst.ID})
	if res.Status != http.StatusOK || len(res.Errors) > 0 || !reflect.DeepEqual(res.Data["instance"], map[string]any{"name": "over-get"}) {
		t.Errorf("GET with variables: %d %s", res.Status, res.Raw)
	}
	// Numbers in the variables keep their JSON text, as over POST: gqlgen takes an Int only
	// as an integer's text, and a float64 would be refused.
	res = a.get(t, tok, `query($first: Int) { instances(organizationId: "acme", first: $first) { edges { node { name } } } }`, map[string]any{"first": 1})
	if res.Status != http.StatusOK || len(res.Errors) > 0 || !strings.Contains(string(res.Raw), `"over-get"`) {
		t.Errorf("GET with an Int variable: %d %s", res.Status, res.Raw)
	}
	// Errors travel the same way as over POST.
	wantError(t, a.get(t, tok, `query($id: ID!) { instance(id: $id) { name } }`, map[string]any{"id": "nope"}), http.StatusOK, "BAD_USER_INPUT")
	wantError(t, a.get(t, tok, `{ me { subject }`, nil), http.StatusOK, "GRAPHQL_PARSE_FAILED")
	// A query string that cannot be read is a 400 with a code.
	for _, c := range []struct{ query, message string }{
		{url.Values{"query": {`query($id: ID!) { instance(id: $id) { name } }`}, "variables": {"{not json"}}.Encode(), "variables is not valid JSON"},
		{url.Values{"query": {`query($id: ID!) { instance(id: $id) { name } }`}, "variables": {`["x"]`}}.Encode(), "variables"},
		{url.Values{"query": {`{ me { subject } }`}, "extensions": {`"persisted"`}}.Encode(), "extensions"},
		{"query=%7Bme%7Bsubject%7D%7D&variables=%zz", "query string is not valid"},
		{"operationName=Q", "query is required"},
		{url.Values{"query": {`{ me { subject } }`}, "variables": {`{"a": ` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`}}.Encode(),
			"variables nests arrays and objects too deeply"},
	} {
		res := a.send(t, tok, httptest.NewRequest(http.MethodGet, "/graphql?"+c.query, nil))
		wantError(t, res, http.StatusBadRequest, "BAD_USER_INPUT")
		if len(res.Errors) == 0 || !strings.Contains(res.Errors[0].Message, c.message) {
			t.Errorf("%s: errors %v, want one saying %q", c.query, res.Errors, c.message)
		}
		if vary := res.Header.Get("Vary"); vary != "Accept" {
			t.Errorf("%s: Vary %q, want Accept", c.query, vary)
		}
	}
}

// TestGETRefusesMutations: a mutation over GET (which caches and prefetchers may replay) is
// refused with 405, Allow: POST and GRAPHQL_VALIDATION_FAILED, as the GraphQL-over-HTTP
// specification says, and does not run, whether it creates or deletes.
func TestGETRefusesMutations(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	inst := a.mustCreate(t, tok, createInput("keep-me"))
	tests := []struct {
		name  string
		query string
		vars  map[string]any
	}{
		{"create", createMutation, map[string]any{"input": createInput("via-get")}},
		{"delete", `mutation($id: ID!) { deleteInstance(input: {id: $id}) { instance { id } } }`, map[string]any{"id": inst.ID}},
		{"named mutation among queries", `query Q { me { subject } } mutation M($id: ID!) { deleteInstance(input: {id: $id}) { instance { id } } }`, map[string]any{"id": inst.ID}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := a.storeState(t)
			params := url.Values{"query": {tt.query}}
			if strings.Contains(tt.query, "mutation M") {
				params.Set("operationName", "M")
			}
			v, err := json.Marshal(tt.vars)
			if err != nil {
				t.Fatal(err)
			}
			params.Set("variables", string(v))
			res := a.send(t, tok, httptest.NewRequest(http.MethodGet, "/graphql?"+params.Encode(), nil))
			wantError(t, res, http.StatusMethodNotAllowed, "GRAPHQL_VALIDATION_FAILED")
			if allow := res.Header.Get("Allow"); allow != http.MethodPost {
				t.Errorf("Allow %q, want POST", allow)
			}
			if res.Data != nil {
				t.Errorf("data with the refusal: %s", res.Raw)
			}
			if !reflect.DeepEqual(before, a.storeState(t)) {
				t.Error("a mutation over GET changed Redis")
			}
		})
	}
	// A mutation of more top-level fields than the tokens left is a rate limit's 429, not a
	// 405 that retrying could never change.
	clock := newTestClock()
	limited := newAPI(t, func(o *Options) { o.RateLimit, o.RateBurst, o.now = 1, 5, clock.now })
	three := url.Values{"query": {`mutation { a: createStreamTicket { ticket } b: createStreamTicket { ticket } c: createStreamTicket { ticket } }`}}.Encode()
	ltok := limited.admin(t)
	wantError(t, limited.send(t, ltok, httptest.NewRequest(http.MethodGet, "/graphql?"+three, nil)), http.StatusMethodNotAllowed, "GRAPHQL_VALIDATION_FAILED")
	wantError(t, limited.send(t, ltok, httptest.NewRequest(http.MethodGet, "/graphql?"+three, nil)), http.StatusTooManyRequests, "RATE_LIMITED")
	// The query of the same document still runs over GET.
	params := url.Values{"query": {`query Q { me { subject } } mutation M { deleteInstance(input: {id: "x"}) { instance { id } } }`}, "operationName": {"Q"}}
	if res := a.send(t, tok, httptest.NewRequest(http.MethodGet, "/graphql?"+params.Encode(), nil)); res.Status != http.StatusOK || len(res.Errors) > 0 {
		t.Errorf("query Q over GET: %d %s", res.Status, res.Raw)
	}
}

// TestHealthEndpoints: /healthz always answers 200; /readyz answers 200 while Ready passes
// (by default it pings the real Redis) and 503 when it fails. Neither needs a token.
func TestHealthEndpoints(t *testing.T) {
	a := newAPI(t)
	notReady := newAPI(t, func(o *Options) {
		o.Ready = func(context.Context) error { return errors.New("redis: connection refused") }
	})
	var deadline bool
	withDeadline := newAPI(t, func(o *Options) {
		o.Ready = func(ctx context.Context) error { _, deadline = ctx.Deadline(); return nil }
	})
	tests := []struct {
		name   string
		api    *api
		method string
		path   string
		status int
		body   string
	}{
		{"healthz", a, http.MethodGet, "/healthz", http.StatusOK, "ok\n"},
		{"healthz while not ready", notReady, http.MethodGet, "/healthz", http.StatusOK, "ok\n"},
		{"healthz HEAD", a, http.MethodHead, "/healthz", http.StatusOK, ""},
		{"healthz POST", a, http.MethodPost, "/healthz", http.StatusMethodNotAllowed, ""},
		{"readyz", a, http.MethodGet, "/readyz", http.StatusOK, "ok\n"},
		{"readyz not ready", notReady, http.MethodGet, "/readyz", http.StatusServiceUnavailable, "not ready\n"},
		{"readyz POST", a, http.MethodPost, "/readyz", http.StatusMethodNotAllowed, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := tt.api.serve(httptest.NewRequest(tt.method, tt.path, nil))
			if rec.Code != tt.status {
				t.Errorf("status = %d, want %d", rec.Code, tt.status)
			}
			if tt.body != "" && rec.Body.String() != tt.body {
				t.Errorf("body = %q, want %q", rec.Body.String(), tt.body)
			}
		})
	}
	// The failure's detail goes to the log, not to the caller.
	rec := notReady.serve(httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if strings.Contains(rec.Body.String(), "connection refused") {
		t.Errorf("readyz leaks the failure: %q", rec.Body.String())
	}
	// Ready is given a bounded context, so a hung Redis cannot hang the probe.
	withDeadline.serve(httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if !deadline {
		t.Error("Ready was called without a deadline")
	}
}

// TestReadyzFollowsRedis: the default Ready of the harness pings the real Redis; once the
// client is closed the probe fails with 503.
func TestReadyzFollowsRedis(t *testing.T) {
	a := newAPI(t)
	if rec := a.serve(httptest.NewRequest(http.MethodGet, "/readyz", nil)); rec.Code != http.StatusOK {
		t.Fatalf("readyz = %d", rec.Code)
	}
	if err := a.rdb.Close(); err != nil {
		t.Fatal(err)
	}
	if rec := a.serve(httptest.NewRequest(http.MethodGet, "/readyz", nil)); rec.Code != http.StatusServiceUnavailable {
		t.Errorf("readyz with Redis gone = %d, want 503", rec.Code)
	}
}

// TestRootServesDashboardAndGraphiQLServesHTML: / serves the dashboard and /graphiql the
// GraphiQL page, both pointing at /graphql without a token; unknown paths are 404.
func TestRootServesDashboardAndGraphiQLServesHTML(t *testing.T) {
	a := newAPI(t)
	rec := a.serve(httptest.NewRequest(http.MethodGet, "/", nil))
	if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.Contains(body, `data-endpoint="/graphql"`) || !strings.Contains(body, "/dashboard/assets/app.js") {
		t.Errorf("/ = %d, want 200 and the dashboard:\n%s", rec.Code, body)
	}

	rec = a.serve(httptest.NewRequest(http.MethodGet, "/graphiql", nil))
	body, _ := io.ReadAll(rec.Body)
	if rec.Code != http.StatusOK {
		t.Fatalf("/graphiql = %d", rec.Code)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("Content-Type = %q, want text/html", ct)
	}
	for _, want := range []string{"<!DOCTYPE html>", `data-endpoint="/graphql"`, "graphiql.min.js"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("page lacks %q", want)
		}
	}

	for _, path := range []string{"/nope", "/graphql/extra", "/index.html"} {
		if rec := a.serve(httptest.NewRequest(http.MethodGet, path, nil)); rec.Code != http.StatusNotFound {
			t.Errorf("%s = %d, want 404", path, rec.Code)
		}
	}
}
