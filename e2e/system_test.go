package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/feed"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
	"github.com/computeql/computeql/server"
	"github.com/computeql/computeql/store"
	"github.com/computeql/computeql/worker"
)

var redisServer *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &redisServer) }

var testSecret = []byte("e2e-secret-e2e-secret-e2e-secret")

// buildDelay is how long the simulated region builds a server: long enough that a browser
// polling the page sees BUILDING even on a loaded two-core machine, short enough to keep the
// tests quick.
const buildDelay = 4 * time.Second

// system is computeql wired as `computeql all` wires it, serving on a loopback port.
type system struct {
	URL  string
	keys *auth.Keys
}

// startSystem runs the API, the feed, a worker and the region's clock on a freshly flushed
// Redis until the test ends.
func startSystem(t *testing.T) *system {
	t.Helper()
	rdb := redisServer.Client(t)
	quiet := slog.New(slog.DiscardHandler)
	cat := region.Demo()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var events *feed.Feed
	// Shutdown order, as in main: the HTTP server (cleaned up first, as it is registered
	// later), then the worker, the region's clock, the sockets and the feed's readers, which
	// all end with ctx.
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if events != nil {
			events.Wait()
		}
	})

	st := store.New(rdb)
	if err := st.Load(ctx); err != nil {
		t.Fatal(err)
	}
	q, err := queue.New(rdb, queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	cloud, err := sim.New(rdb, sim.Options{Catalog: cat, BuildDelay: buildDelay, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	orgs := make([]string, len(cat.Organizations))
	for i, o := range cat.Organizations {
		orgs[i] = o.ID
	}
	wk, err := worker.New(worker.Options{
		Store: st, Region: cloud, Queue: q, Logger: quiet, Registerer: prometheus.NewRegistry(),
		Organizations: func() []string { return orgs },
		NetworkExists: func(id string) bool { _, ok := cat.Network(id); return ok },
	})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := instance.NewService(instance.Options{Catalog: cat, Store: st, Queue: q, Region: cloud, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := auth.NewKeys(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	events = feed.New(ctx, st, feed.Options{Logger: quiet})
	h, err := server.New(server.Options{
		Service: svc, Feed: events, Keys: keys, Logger: quiet,
		// The browser and the test share one principal per test; a burst of page loads must
		// not be what a test measures.
		RateLimit: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.BaseContext = func(net.Listener) context.Context { return ctx }
	srv.Start()
	t.Cleanup(srv.Close)

	wg.Go(func() {
		if err := wk.Start(ctx); err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	wg.Go(func() { _ = cloud.Run(ctx) })
	return &system{URL: srv.URL, keys: keys}
}

// token mints a token for subject with the grants.
func (s *system) token(t *testing.T, subject string, grants ...auth.Grant) string {
	t.Helper()
	tok, err := s.keys.Mint(auth.Principal{Subject: subject, Grants: grants}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// graphql runs an operation over HTTP and fails the test on any error, top-level or user.
func (s *system) graphql(t *testing.T, token, query string, vars map[string]any) map[string]any {
	t.Helper()
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, s.URL+"/graphql", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Data   map[string]any `json:"data"`
		Errors []any          `json:"errors"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("decode %s: %v", req.URL, err)
	}
	if len(out.Errors) > 0 {
		t.Fatalf("%s: %v", query, out.Errors)
	}
	for _, payload := range out.Data {
		if p, ok := payload.(map[string]any); ok {
			if ue, _ := p["userErrors"].([]any); len(ue) > 0 {
				t.Fatalf("%s: userErrors %v", query, ue)
			}
		}
	}
	return out.Data
}

// createInstance creates an instance on acme/web's eu-west network and returns its id.
func (s *system) createInstance(t *testing.T, token, name, flavor string) string {
	t.Helper()
	data := s.graphql(t, token, `mutation($in: CreateInstanceInput!) { createInstance(input: $in) { instance { id } userErrors { field code message } } }`,
		map[string]any{"in": map[string]any{
			"organizationId": "acme", "projectId": "web", "networkId": "net-acme-web-eu", "name": name,
			"flavorId": flavor, "imageId": "ubuntu-24.04",
			"networking": map[string]any{"securityGroupIds": []string{"sg-acme-web-eu-ssh"}, "publicIP": true},
		}})
	return data["createInstance"].(map[string]any)["instance"].(map[string]any)["id"].(string)
}
