package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/region"
)

// calls are the region calls faults apply to, each on a server that exists (made by a healthy
// simulator sharing the Redis).
var calls = []struct {
	name string
	do   func(ctx context.Context, s *Sim, id string) error
}{
	{"FindServers", func(ctx context.Context, s *Sim, id string) error {
		_, err := s.FindServers(ctx, region.Scope{}, region.InstanceTag, "inst-1")
		return err
	}},
	{"CreateServer", func(ctx context.Context, s *Sim, id string) error {
		_, err := s.CreateServer(ctx, specOn("big", "inst-2"))
		return err
	}},
	{"UpdateNetworking", func(ctx context.Context, s *Sim, id string) error {
		_, err := s.UpdateNetworking(ctx, id, region.ServerNetworking{PublicIP: true})
		return err
	}},
	{"DeleteServer", func(ctx context.Context, s *Sim, id string) error {
		return s.DeleteServer(ctx, id)
	}},
}

// TestErrorRateOne: every call fails with ErrUnavailable and changes nothing.
func TestErrorRateOne(t *testing.T) {
	e := newEnv(t)
	cat := tinyCatalog(t)
	healthy := e.sim(Options{Catalog: cat})
	faulty := e.sim(Options{Catalog: cat, Faults: Faults{ErrorRate: 1}})
	ctx := context.Background()
	srv, err := healthy.CreateServer(ctx, specOn("big", "inst-1"))
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			for range 20 {
				if err := c.do(ctx, faulty, srv.ID); !errors.Is(err, region.ErrUnavailable) {
					t.Fatalf("%s: %v, want an error wrapping ErrUnavailable", c.name, err)
				}
			}
		})
	}
	if got := e.mustGet(t, healthy, srv.ID); got.State != region.ServerPending || got.PublicIP != "" {
		t.Errorf("failed calls changed the server: %+v", got)
	}
	if n := e.eventCount(t); n != 1 {
		t.Errorf("%d events, want only the healthy creation", n)
	}
}

// TestErrorRatePartial: about the configured fraction of calls fails (loose bounds: 30% of 300
// is 90 with a standard deviation of 8, so 45..135 is more than five deviations each way).
func TestErrorRatePartial(t *testing.T) {
	e := newEnv(t)
	s := e.sim(Options{Faults: Faults{ErrorRate: 0.3}})
	ctx := context.Background()
	failed := 0
	for range 300 {
		_, err := s.FindServers(ctx, scopeOf(t, region.Demo(), "net-acme-web-eu"), region.InstanceTag, "x")
		switch {
		case errors.Is(err, region.ErrUnavailable):
			failed++
		case err != nil:
			t.Fatalf("FindServers: %v, want nil or ErrUnavailable", err)
		}
	}
	if failed < 45 || failed > 135 {
		t.Errorf("%d of 300 calls failed, want about 90", failed)
	}
}

// TestSlowCalls: every call takes at least SlowCalls, and gives up when its context ends,
// without acting.
func TestSlowCalls(t *testing.T) {
	const slow = 60 * time.Millisecond
	e := newEnv(t)
	cat := tinyCatalog(t)
	healthy := e.sim(Options{Catalog: cat})
	ctx := context.Background()
	srv, err := healthy.CreateServer(ctx, specOn("big", "inst-1"))
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}

	t.Run("delayed", func(t *testing.T) {
		s := e.sim(Options{Catalog: cat, Faults: Faults{SlowCalls: slow}})
		for _, c := range calls {
			start := time.Now()
			if err := c.do(ctx, s, srv.ID); err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			if took := time.Since(start); took < slow {
				t.Errorf("%s took %s, want at least %s", c.name, took, slow)
			}
		}
	})

	t.Run("cancelled", func(t *testing.T) {
		before := e.eventCount(t)
		s := e.sim(Options{Catalog: cat, Faults: Faults{SlowCalls: time.Hour}})
		for _, c := range calls {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			done := make(chan error, 1)
			go func() { done <- c.do(cctx, s, srv.ID) }()
			select {
			case err := <-done:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s: %v, want the context's error", c.name, err)
				}
			case <-time.After(waitLimit):
				t.Fatalf("%s still running %s after its context ended", c.name, waitLimit)
			}
			cancel()
		}
		if n := e.eventCount(t); n != before {
			t.Errorf("cancelled calls recorded %d events", n-before)
		}
	})
}

// TestFailBuild: a server whose name has the prefix ends in ERROR with a message instead of
// RUNNING; one without it runs.
func TestFailBuild(t *testing.T) {
	e := newEnv(t)
	s := e.sim(Options{Faults: Faults{FailBuildPrefix: "doomed-"}})
	events := e.watch(s, "0-0")
	e.run(s)
	ctx := context.Background()
	bad, err := s.CreateServer(ctx, spec(t, "net-acme-web-eu", "doomed-web", "inst-bad"))
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	good, err := s.CreateServer(ctx, spec(t, "net-acme-web-eu", "web-doomed-", "inst-good"))
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	got := e.waitState(t, s, bad.ID, region.ServerError)
	if got.Health != region.HealthError || got.Message == "" {
		t.Errorf("failed server: health %s message %q, want ERROR and a message", got.Health, got.Message)
	}
	if ok := e.waitState(t, s, good.ID, region.ServerRunning); ok.Health != region.HealthHealthy || ok.Message != "" {
		t.Errorf("healthy server: health %s message %q", ok.Health, ok.Message)
	}
	counts := map[string]int{}
	for counts[bad.ID] < 3 || counts[good.ID] < 3 {
		ev := next(t, events)
		counts[ev.ServerID]++
	}
	eventually.Holds(t, waitLimit, func() bool {
		n, err := e.rdb.ZCard(ctx, dueKey).Result()
		return err == nil && n == 0
	}, "no transition due: ERROR is settled")
	if got := e.mustGet(t, s, bad.ID); got.State != region.ServerError {
		t.Errorf("failed server moved on to %s", got.State)
	}
}

// TestDuplicateCreates: one CreateServer makes two servers carrying the tag, with their own ids
// and addresses.
func TestDuplicateCreates(t *testing.T) {
	e := newEnv(t)
	s := e.sim(Options{Faults: Faults{DuplicateCreates: true}})
	ctx := context.Background()
	sp := spec(t, "net-acme-web-eu", "web-1", "inst-1")
	created, err := s.CreateServer(ctx, sp)
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	found, err := s.FindServers(ctx, sp.Scope, region.InstanceTag, "inst-1")
	if err != nil {
		t.Fatalf("FindServers: %v", err)
	}
	if len(found) != 2 {
		t.Fatalf("%d servers carry the tag after one create, want 2", len(found))
	}
	a, b := found[0], found[1]
	if a.ID == b.ID || a.PrivateIP == b.PrivateIP || a.MAC == b.MAC {
		t.Errorf("duplicates share an id, IP or MAC: %+v and %+v", a, b)
	}
	if created.ID != a.ID && created.ID != b.ID {
		t.Errorf("returned server %s is neither of %s, %s", created.ID, a.ID, b.ID)
	}
	if n := e.eventCount(t); n != 2 {
		t.Errorf("%d events, want two creations", n)
	}
}

// TestSeveralClocks runs three clocks, each on its own client as separate processes would, over
// the same servers: every transition is applied exactly once, so each server has one creation,
// one BUILDING and one RUNNING update, then one DELETING update and one deletion.
func TestSeveralClocks(t *testing.T) {
	const n = 150
	e := newEnv(t)
	cat := tinyCatalog(t)
	s := e.sim(Options{Catalog: cat})
	ctx, stop := context.WithCancel(context.Background())
	var clocks sync.WaitGroup
	for i := range 3 {
		clock := e.simOn(e.client(), Options{Catalog: cat, Tick: time.Millisecond})
		clocks.Go(func() {
			if err := clock.Run(ctx); err != nil {
				t.Errorf("clock %d: Run: %v", i, err)
			}
		})
	}
	defer func() { stop(); clocks.Wait() }()

	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			srv, err := s.CreateServer(ctx, specOn("big", fmt.Sprintf("inst-%d", i)))
			if err != nil {
				t.Errorf("CreateServer: %v", err)
				return
			}
			ids[i] = srv.ID
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, id := range ids {
		e.waitState(t, s, id, region.ServerRunning)
	}
	for _, id := range ids {
		wg.Go(func() {
			if err := s.DeleteServer(ctx, id); err != nil {
				t.Errorf("DeleteServer: %v", err)
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		e.waitGone(t, s, id)
	}
	// Stop the clocks before counting, so a late duplicate would be counted too.
	stop()
	clocks.Wait()

	msgs, err := e.rdb.XRange(context.Background(), eventsKey, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	type count struct{ created, updated, deleted int }
	counts := map[string]*count{}
	for _, id := range ids {
		counts[id] = &count{}
	}
	for _, m := range msgs {
		c := counts[m.Values["id"].(string)]
		if c == nil {
			t.Fatalf("event of an unknown server: %v", m.Values)
		}
		switch region.EventKind(m.Values["kind"].(string)) {
		case region.ServerCreated:
			c.created++
		case region.ServerUpdated:
			c.updated++
		case region.ServerDeleted:
			c.deleted++
		}
	}
	want := count{created: 1, updated: 3, deleted: 1}
	for id, c := range counts {
		if *c != want {
			t.Errorf("server %s: %+v events, want %+v", id, *c, want)
		}
	}
}

// TestClockSurvivesFailingTicks: a tick that fails (here: the due-time key holds the wrong
// type, as a Redis error would) is logged and the clock goes on; once Redis answers again the
// transitions that were due are applied.
func TestClockSurvivesFailingTicks(t *testing.T) {
	e := newEnv(t)
	var logged safeBuffer
	s := e.sim(Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	srv, err := s.CreateServer(context.Background(), spec(t, "net-acme-web-eu", "a", "i-1"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	due := e.rdb.ZRangeWithScores(ctx, dueKey, 0, -1).Val()
	e.rdb.Del(ctx, dueKey)
	e.rdb.Set(ctx, dueKey, "not a sorted set", 0)
	e.run(s)
	eventually.Holds(t, 5*time.Second, func() bool { return strings.Contains(logged.String(), "clock tick failed") }, "a failed tick logged")
	if got := e.mustGet(t, s, srv.ID); got.State != region.ServerPending {
		t.Fatalf("state %s while every tick fails", got.State)
	}
	e.rdb.Del(ctx, dueKey)
	e.rdb.ZAdd(ctx, dueKey, due...)
	e.waitState(t, s, srv.ID, region.ServerRunning)
}

// safeBuffer is a bytes.Buffer the clock's goroutine may write while the test reads.
type safeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
