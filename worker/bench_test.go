package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
	"github.com/computeql/computeql/store"
	"github.com/computeql/computeql/worker"
)

// benchCatalog is one organization with a network large enough for thousands of servers and
// quota that never refuses.
func benchCatalog(b *testing.B) *region.Catalog {
	b.Helper()
	big := int64(1 << 40)
	cat := map[string]any{
		"regions":       []any{map[string]any{"id": "r1", "name": "R1"}},
		"organizations": []any{map[string]any{"id": "bench", "name": "Bench", "projects": []any{map[string]any{"id": "p", "name": "P"}}, "quota": map[string]any{"servers": big, "gpus": big, "publicIPs": big, "cpus": big, "memoryGiB": big}}},
		"networks":      []any{map[string]any{"id": "n1", "name": "N1", "organizationId": "bench", "projectId": "p", "region": "r1", "prefix": "10.0.0.0/16"}},
		"flavors":       []any{map[string]any{"id": "f1", "name": "F1", "cpus": 1, "memoryGiB": 1, "diskGB": 20, "architecture": "x86_64", "regions": []any{"r1"}}},
		"images":        []any{map[string]any{"id": "i1", "name": "I1", "architecture": "x86_64", "sizeGiB": 1, "virtualization": "any", "state": "ready", "regions": []any{"r1"}}},
	}
	data, _ := json.Marshal(cat)
	c, err := region.Parse(data)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// timedStore records when each instance's status first commits a running server at its
// current generation, and when a given health first commits: the moments the benchmark
// measures, taken where they happen rather than by polling.
type timedStore struct {
	*store.Store
	mu      sync.Mutex
	running map[string]time.Time
	health  map[string]instance.HealthStatus
	allUp   chan struct{}
	want    int
	// healthChanged receives every committed change of an instance's health.
	healthChanged chan healthChange
}

type healthChange struct {
	id     string
	health instance.HealthStatus
	at     time.Time
}

func (s *timedStore) WriteStatus(ctx context.Context, inst *instance.Instance, st instance.Status, ev instance.Event) (bool, error) {
	ok, err := s.Store.WriteStatus(ctx, inst, st, ev)
	if !ok || err != nil {
		return ok, err
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.PowerState == instance.PowerRunning && st.ObservedGeneration == inst.Generation {
		if _, seen := s.running[inst.ID]; !seen {
			s.running[inst.ID] = now
			if len(s.running) == s.want {
				close(s.allUp)
			}
		}
	}
	if st.HealthStatus != s.health[inst.ID] {
		s.health[inst.ID] = st.HealthStatus
		select {
		case s.healthChanged <- healthChange{inst.ID, st.HealthStatus, now}:
		default: // the buffer outlasts convergence; a full one means nobody measures
		}
	}
	return true, nil
}

// BenchmarkConvergeAndPropagate creates 2,000 instances at once against a region with no build
// delay, reconciled by two workers (two consumer pools of 8), and reports the time until all
// run; then it changes the health of 500 servers in the region, one at a time, and reports the
// time from each change to the instance status commit (p50, p99).
func BenchmarkConvergeAndPropagate(b *testing.B) {
	const instances, changes = 2000, 500
	for b.Loop() {
		converge, prop := convergeAndPropagate(b, instances, changes)
		b.ReportMetric(converge.Seconds(), "converge-s")
		b.ReportMetric(float64(instances)/converge.Seconds(), "instances/s")
		b.ReportMetric(float64(prop[len(prop)/2].Microseconds())/1000, "prop-p50-ms")
		b.ReportMetric(float64(prop[len(prop)*99/100].Microseconds())/1000, "prop-p99-ms")
	}
}

func convergeAndPropagate(b *testing.B, instances, changes int) (time.Duration, []time.Duration) {
	rdb := redisServer.Client(b)
	cat := benchCatalog(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	q, err := queue.New(rdb, queue.Options{})
	if err != nil {
		b.Fatal(err)
	}
	if err := q.Setup(ctx); err != nil {
		b.Fatal(err)
	}
	cloud, err := sim.New(rdb, sim.Options{Catalog: cat, Tick: 5 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	ts := &timedStore{Store: store.New(rdb), running: map[string]time.Time{}, health: map[string]instance.HealthStatus{},
		allUp: make(chan struct{}), want: instances, healthChanged: make(chan healthChange, 8192)}
	quiet := slog.New(slog.DiscardHandler)
	svc, err := instance.NewService(instance.Options{Catalog: cat, Store: ts.Store, Queue: q, Region: cloud, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	var running sync.WaitGroup
	running.Go(func() { cloud.Run(ctx) })
	for i := range 2 {
		// Each worker has its own client, as a worker process would.
		own := redis.NewClient(&redis.Options{Addr: redisServer.Addr})
		defer own.Close()
		wq, _ := queue.New(own, queue.Options{})
		w, err := worker.New(worker.Options{Store: ts, Region: cloud, Queue: wq, Organizations: func() []string { return []string{"bench"} },
			NetworkExists: func(id string) bool { _, ok := cat.Network(id); return ok },
			Logger:        quiet, Consumer: queue.ConsumerOptions{Name: fmt.Sprint("w", i), Block: 100 * time.Millisecond}})
		if err != nil {
			b.Fatal(err)
		}
		running.Go(func() { w.Start(ctx) })
	}
	defer running.Wait()
	defer cancel()

	admin := auth.WithPrincipal(ctx, auth.Principal{Subject: "bench", Grants: []auth.Grant{{OrganizationID: "bench", Role: auth.RoleAdmin}}})
	start := time.Now()
	var creators sync.WaitGroup
	ids := make([]string, instances)
	for c := range 8 {
		creators.Go(func() {
			for i := c; i < instances; i += 8 {
				inst, err := svc.Create(admin, instance.CreateRequest{OrganizationID: "bench", ProjectID: "p", NetworkID: "n1",
					Name: fmt.Sprint("vm-", i), FlavorID: "f1", ImageID: "i1"})
				if err != nil {
					b.Error(err)
					return
				}
				ids[i] = inst.ID
			}
		})
	}
	creators.Wait()
	select {
	case <-ts.allUp:
	case <-time.After(2 * time.Minute):
		b.Fatalf("only %d of %d instances running after 2 minutes", len(ts.running), instances)
	}
	ts.mu.Lock()
	var last time.Time
	for _, at := range ts.running {
		if at.After(last) {
			last = at
		}
	}
	ts.mu.Unlock()
	converge := last.Sub(start)

	// Propagation: flip one server's health at a time and wait for its status commit.
	prop := make([]time.Duration, 0, changes)
	for i := range changes {
		id := ids[i%instances]
		inst, err := ts.Get(ctx, []string{"bench"}, id)
		if err != nil {
			b.Fatal(err)
		}
		servers, err := cloud.FindServers(ctx, inst.Scope(), region.InstanceTag, id)
		if err != nil || len(servers) != 1 {
			b.Fatalf("servers of %s: %v %v", id, servers, err)
		}
		target, want := region.HealthDegraded, instance.HealthDegraded
		if inst.Status.HealthStatus == instance.HealthDegraded {
			target, want = region.HealthHealthy, instance.HealthHealthy
		}
		changed := time.Now()
		if err := cloud.SetHealth(ctx, servers[0].ID, target); err != nil {
			b.Fatal(err)
		}
		timeout := time.After(10 * time.Second)
	wait:
		for {
			select {
			case c := <-ts.healthChanged:
				if c.id == id && c.health == want && c.at.After(changed) {
					prop = append(prop, c.at.Sub(changed))
					break wait
				}
			case <-timeout:
				b.Fatalf("health of %s did not propagate", id)
			}
		}
	}
	slices.Sort(prop)
	return converge, prop
}
