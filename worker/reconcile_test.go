package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/worker"
)

// interfering is the worker's store with a write slipped in: before runs once, just before the
// reconciler's first status write, as a concurrent writer (the API showing a deletion, another
// worker) would.
type interfering struct {
	worker.Store
	mu     sync.Mutex
	before func()
}

func (s *interfering) WriteStatus(ctx context.Context, inst *instance.Instance, st instance.Status, ev instance.Event) (bool, error) {
	s.mu.Lock()
	f := s.before
	s.before = nil
	s.mu.Unlock()
	if f != nil {
		f()
	}
	return s.Store.WriteStatus(ctx, inst, st, ev)
}

// A reconciler whose status write lost the race to a newer status does not overwrite it; the
// next reconcile reads the newer status and converges from there.
func TestStaleStatusWriteDoesNotOverwrite(t *testing.T) {
	e := newEnv(t, func(s *setup) { s.manual = true })
	goRun(t, "region clock", e.region.Run)
	created := e.create(t, "web-1")
	slipped := created.Status
	slipped.Conditions = []instance.Condition{{
		Type: instance.ConditionAvailable, Status: instance.ConditionFalse, Reason: instance.ReasonProvisioning,
		Message: "written by someone else", LastTransitionTime: time.Now().UTC().Truncate(time.Second),
	}}
	st := &interfering{Store: e.st, before: func() {
		cur := e.get(t, created.ID)
		if ok, err := e.st.WriteStatus(bg, cur, slipped, instance.Event{Kind: instance.EventStatusChanged, Changed: instance.StatusChanges(cur.Status, slipped), At: time.Now()}); !ok || err != nil {
			t.Errorf("slipping a status in: %v, %v", ok, err)
		}
	}}
	metrics, err := worker.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &worker.Reconciler{Store: st, Region: e.region, NetworkExists: func(string) bool { return true }, Yield: 50 * time.Millisecond, Logger: quiet, Now: time.Now, Metrics: metrics}
	task := queue.Task{Key: created.Key(), Attempt: 1}

	again, err := r.Handle(bg, task)
	if err != nil || again <= 0 {
		t.Fatalf("first reconcile: %v, %v; want a poll while the server builds", again, err)
	}
	got := e.get(t, created.ID)
	if got.StatusVersion != created.StatusVersion+1 {
		t.Errorf("status version %d, want %d: only the slipped-in write", got.StatusVersion, created.StatusVersion+1)
	}
	if c := available(t, got); c.Message != "written by someone else" {
		t.Errorf("the stale write overwrote the newer status: %+v", c)
	}
	if srvs := e.servers(t, got); len(srvs) != 1 {
		t.Fatalf("%d servers after the first reconcile, want 1", len(srvs))
	}

	var inst *instance.Instance
	eventually.Holds(t, convergeLimit, func() bool {
		if _, err := r.Handle(bg, task); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
		inst = e.get(t, created.ID)
		return converged(inst)
	}, "RUNNING, last %s", last(&inst))
	if srvs := e.servers(t, inst); len(srvs) != 1 {
		t.Errorf("%d servers, want 1", len(srvs))
	}
	if c := available(t, inst); c.Reason != instance.ReasonProvisioned {
		t.Errorf("condition %+v, want Provisioned", c)
	}
}
