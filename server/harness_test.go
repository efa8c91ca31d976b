package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/feed"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
	"github.com/computeql/computeql/store"
	"github.com/computeql/computeql/worker"
)

var redisServer *redistest.Server

func TestMain(m *testing.M) {
	if addr := os.Getenv(apiProcessEnv); addr != "" {
		if err := serveAPIProcess(addr); err != nil {
			fmt.Fprintln(os.Stderr, "API process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	redistest.Main(m, &redisServer)
}

var testSecret = []byte("test-secret-test-secret-test-sec")

// api is the full HTTP handler on a freshly flushed real Redis with the demo catalogue.
type api struct {
	handler http.Handler
	keys    *auth.Keys
	rdb     *redis.Client
	// region is the simulated region the verbs act on; its clock runs only after runWorkers.
	region *sim.Sim
	feed   *feed.Feed
}

func newAPI(tb testing.TB, mutate ...func(*Options)) *api {
	tb.Helper()
	rdb := redisServer.Client(tb)
	rdb.AddHook(store.CallLimitHook{}) // as the process adds it to its client
	return apiOn(tb, rdb, feed.Options{}, mutate...)
}

// apiOn builds an API process on an existing Redis without flushing it, with its own service
// and feed (fopts; its Block and Logger are set when zero): several on one Redis are several
// API processes.
func apiOn(tb testing.TB, rdb *redis.Client, fopts feed.Options, mutate ...func(*Options)) *api {
	tb.Helper()
	if fopts.Block == 0 {
		fopts.Block = 50 * time.Millisecond
	}
	a, stop, err := assemble(rdb, fopts, mutate...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(stop)
	return a
}

// assemble builds an API process's handler on rdb, with the demo catalogue, an unclocked
// simulated region and the test secret; stop ends its feed's readers.
func assemble(rdb *redis.Client, fopts feed.Options, mutate ...func(*Options)) (a *api, stop func(), err error) {
	q, err := queue.New(rdb, queue.Options{})
	if err != nil {
		return nil, nil, err
	}
	// Tests provoke internal errors and warnings on purpose; their logs would only be noise.
	quiet := slog.New(slog.DiscardHandler)
	cloud, err := sim.New(rdb, sim.Options{Catalog: region.Demo(), Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	svc, err := instance.NewService(instance.Options{Catalog: region.Demo(), Store: store.New(rdb, store.WithQueue(q)), Queue: q, Region: cloud, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	keys, err := auth.NewKeys(testSecret)
	if err != nil {
		return nil, nil, err
	}
	if fopts.Logger == nil {
		fopts.Logger = quiet
	}
	feedCtx, stopFeed := context.WithCancel(context.Background())
	events := feed.New(feedCtx, store.New(rdb), fopts)
	stop = func() { stopFeed(); events.Wait() }
	opts := Options{Service: svc, Feed: events, Keys: keys, Logger: quiet, Ready: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }}
	for _, m := range mutate {
		m(&opts)
	}
	h, err := New(opts)
	if err != nil {
		stop()
		return nil, nil, err
	}
	return &api{handler: h, keys: keys, rdb: rdb, region: cloud, feed: events}, stop, nil
}

// runWorkers starts what realises instances behind the API: a worker and the simulated
// region's clock, both stopped when the test ends or, before, by the returned stop. mutate may
// change the worker's options.
func (a *api) runWorkers(tb testing.TB, mutate ...func(*worker.Options)) (stop func()) {
	tb.Helper()
	quiet := slog.New(slog.DiscardHandler)
	q, err := queue.New(a.rdb, queue.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	// A worker without its consumer groups stops at once.
	if err := q.Setup(context.Background()); err != nil {
		tb.Fatal(err)
	}
	cat := region.Demo()
	orgs := make([]string, len(cat.Organizations))
	for i, o := range cat.Organizations {
		orgs[i] = o.ID
	}
	wo := worker.Options{
		Store: store.New(a.rdb), Region: a.region, Queue: q, Logger: quiet, Registerer: prometheus.NewRegistry(),
		Organizations: func() []string { return orgs },
		NetworkExists: func(id string) bool { _, ok := cat.Network(id); return ok },
	}
	for _, m := range mutate {
		m(&wo)
	}
	wk, err := worker.New(wo)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := wk.Start(ctx); err != nil {
			tb.Errorf("worker: %v", err)
		}
	})
	wg.Go(func() { _ = a.region.Run(ctx) })
	stop = func() { cancel(); wg.Wait() }
	tb.Cleanup(stop)
	return stop
}

// token mints a token for a principal with the grants.
func (a *api) token(tb testing.TB, subject string, grants ...auth.Grant) string {
	tb.Helper()
	tok, err := a.keys.Mint(auth.Principal{Subject: subject, Grants: grants}, time.Now(), time.Hour)
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

func (a *api) admin(tb testing.TB) string {
	return a.token(tb, "admin", auth.Grant{OrganizationID: "acme", Role: auth.RoleAdmin}, auth.Grant{OrganizationID: "globex", Role: auth.RoleAdmin})
}

// gqlResponse is a GraphQL response with errors' codes easy to reach.
type gqlResponse struct {
	Status int
	Header http.Header    `json:"-"`
	Raw    []byte         `json:"-"`
	Data   map[string]any `json:"data"`
	Errors []struct {
		Message    string         `json:"message"`
		Path       []any          `json:"path"`
		Extensions map[string]any `json:"extensions"`
	} `json:"errors"`
	Extensions map[string]any `json:"extensions"`
}

// codes lists the extensions.code of every top-level error.
func (r *gqlResponse) codes() []string {
	var out []string
	for _, e := range r.Errors {
		c, _ := e.Extensions["code"].(string)
		out = append(out, c)
	}
	return out
}

// post sends a GraphQL operation as a JSON POST with the bearer token ("" for none).
func (a *api) post(tb testing.TB, token, query string, vars map[string]any) *gqlResponse {
	tb.Helper()
	return a.send(tb, token, postRequest(tb, query, vars))
}

// postRequest builds the JSON POST of a GraphQL operation.
func postRequest(tb testing.TB, query string, vars map[string]any) *http.Request {
	tb.Helper()
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		tb.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/graphql", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	return req
}

func (a *api) do(tb testing.TB, token, contentType string, body []byte) *gqlResponse {
	tb.Helper()
	req := httptest.NewRequest(http.MethodPost, "/graphql", bytes.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	return a.send(tb, token, req)
}

// send serves req with the bearer token ("" for none) and decodes the JSON response, failing
// the test when the body is not JSON.
func (a *api) send(tb testing.TB, token string, req *http.Request) *gqlResponse {
	tb.Helper()
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return decodeResponse(tb, a.serve(req))
}

// decodeResponse decodes a recorded response, failing the test when the body is not JSON.
func decodeResponse(tb testing.TB, rec *httptest.ResponseRecorder) *gqlResponse {
	tb.Helper()
	out := &gqlResponse{Status: rec.Code, Header: rec.Header()}
	raw, _ := io.ReadAll(rec.Body)
	out.Raw = raw
	if err := json.Unmarshal(raw, out); err != nil {
		tb.Fatalf("response is not JSON (status %d): %s", rec.Code, raw)
	}
	return out
}

// serve runs one request through the whole handler.
func (a *api) serve(req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	a.handler.ServeHTTP(rec, req)
	return rec
}

// get sends a GraphQL operation as GET /graphql?query=…&variables=… with the bearer token.
func (a *api) get(tb testing.TB, token, query string, vars map[string]any) *gqlResponse {
	tb.Helper()
	params := url.Values{"query": {query}}
	if vars != nil {
		v, err := json.Marshal(vars)
		if err != nil {
			tb.Fatal(err)
		}
		params.Set("variables", string(v))
	}
	return a.send(tb, token, httptest.NewRequest(http.MethodGet, "/graphql?"+params.Encode(), nil))
}

// mustPost sends an operation and fails the test on any top-level error or non-200 status.
func (a *api) mustPost(tb testing.TB, token, query string, vars map[string]any) *gqlResponse {
	tb.Helper()
	res := a.post(tb, token, query, vars)
	if res.Status != http.StatusOK || len(res.Errors) > 0 {
		tb.Fatalf("status %d, errors %s", res.Status, res.Raw)
	}
	return res
}

// decode re-decodes a part of a response (e.g. res.Data["instance"]) into out.
func decode(tb testing.TB, v any, out any) {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		tb.Fatalf("decode %s: %v", b, err)
	}
}

// wantError checks that the response is exactly one top-level error with the status and code.
func wantError(tb testing.TB, res *gqlResponse, status int, code string) {
	tb.Helper()
	if res.Status != status {
		tb.Errorf("status = %d, want %d; body %s", res.Status, status, res.Raw)
	}
	if got := res.codes(); len(got) != 1 || got[0] != code {
		tb.Errorf("error codes = %q, want [%s]; body %s", got, code, res.Raw)
	}
}

// storeState is every key in Redis with a canonical rendering of its value, to prove that
// something wrote nothing at all. DUMP would not do: a hashtable-encoded hash serialises in
// dict order, which an incremental rehash during a mere read can change.
func (a *api) storeState(tb testing.TB) map[string]string {
	tb.Helper()
	ctx := context.Background()
	keys, err := a.rdb.Keys(ctx, "*").Result()
	if err != nil {
		tb.Fatal(err)
	}
	state := make(map[string]string, len(keys))
	for _, k := range keys {
		typ, err := a.rdb.Type(ctx, k).Result()
		if err != nil {
			tb.Fatalf("type %s: %v", k, err)
		}
		var v any
		switch typ {
		case "string":
			v, err = a.rdb.Get(ctx, k).Result()
		case "hash":
			v, err = a.rdb.HGetAll(ctx, k).Result() // a map: encoding/json sorts its keys
		case "set":
			var m []string
			m, err = a.rdb.SMembers(ctx, k).Result()
			sort.Strings(m)
			v = m
		case "zset":
			v, err = a.rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
		case "list":
			v, err = a.rdb.LRange(ctx, k, 0, -1).Result()
		case "stream":
			v, err = a.rdb.XRange(ctx, k, "-", "+").Result()
		default:
			tb.Fatalf("key %s has type %s, which storeState does not know", k, typ)
		}
		if err != nil {
			tb.Fatalf("read %s: %v", k, err)
		}
		ttl, err := a.rdb.PTTL(ctx, k).Result()
		if err != nil {
			tb.Fatalf("pttl %s: %v", k, err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			tb.Fatal(err)
		}
		state[k] = typ + " " + string(b)
		if ttl >= 0 {
			state[k] += " (expires)"
		}
	}
	return state
}

const createMutation = `mutation($input: CreateInstanceInput!) {
  createInstance(input: $input) {
    instance { id name generation organizationId projectId status { provisioningStatus powerState } }
    userErrors { field code message }
  }
}`

func createInput(name string) map[string]any {
	return map[string]any{
		"organizationId": "acme", "projectId": "web", "networkId": "net-acme-web-eu",
		"name": name, "flavorId": "g1.small", "imageId": "ubuntu-24.04",
	}
}
