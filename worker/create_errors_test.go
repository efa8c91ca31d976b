package worker_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/worker"
)

// refusingCreates is the simulated region, except that CreateServer fails with an error
// wrapping sentinel, saying reason, until the test opens it; every call is counted.
type refusingCreates struct {
	region.Client
	sentinel error
	reason   string
	open     atomic.Bool
	// made counts the creates passed on to the region.
	made atomic.Int64

	mu      sync.Mutex
	creates []time.Time // when each CreateServer was called
}

func (r *refusingCreates) CreateServer(ctx context.Context, spec region.ServerSpec) (region.Server, error) {
	r.mu.Lock()
	r.creates = append(r.creates, time.Now())
	r.mu.Unlock()
	if !r.open.Load() {
		// The region's own words wrap the sentinel, as region.ErrNoCapacity and
		// region.ErrRefused ask of drivers.
		return region.Server{}, fmt.Errorf("%s: %w", r.reason, r.sentinel)
	}
	r.made.Add(1)
	return r.Client.CreateServer(ctx, spec)
}

// calls returns when CreateServer was called, in order.
func (r *refusingCreates) calls() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.creates)
}

// startWorker runs a worker like newEnv's, with the options newEnv's setup holds, talking to
// the region rc and recording its status writes in rec; e must have been built with s.manual.
// It returns the worker's registry.
func (e *env) startWorker(t *testing.T, opts worker.Options, rc region.Client, rec *recordingStore) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	rec.Store = e.st
	opts.Store, opts.Region, opts.Queue, opts.Registerer, opts.Logger = rec, rc, e.q, reg, quiet
	opts.Organizations = func() []string { return []string{"acme", "globex"} }
	opts.NetworkExists = func(id string) bool { _, ok := e.cat.Network(id); return ok }
	wk, err := worker.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	e.clock = goRun(t, "region clock", e.region.Run)
	e.work = goRun(t, "worker", wk.Start)
	return reg
}

// resyncPassed reports whether the worker's resync has finished a pass: the instances gauge of
// the last organization it walks is set at the end of every pass, zeros included.
func resyncPassed(t *testing.T, reg prometheus.Gatherer) bool {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "computeql_instances" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "organization" && l.GetValue() == "globex" {
					return true
				}
			}
		}
	}
	return false
}

// settled reports whether the queue holds nothing for the key: not waiting, not being
// handled, and not scheduled for later (no shard has a delayed key; the test has one instance).
func (e *env) settled(t *testing.T, key string) bool {
	t.Helper()
	waiting, err := e.q.Waiting(bg, key)
	if err != nil {
		t.Fatal(err)
	}
	backlog, err := e.q.Backlog(bg)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range backlog {
		if b.Delayed > 0 {
			return false
		}
	}
	return !waiting
}

// A region with no room for the server keeps the instance PROVISIONING, saying
// why, and the create is tried again every CapacityRetry until the region has room; a region
// that refuses the server makes the instance ERROR, finally: the create is not tried again.
func TestCreateServerErrors(t *testing.T) {
	const capacityRetry = 100 * time.Millisecond
	tests := []struct {
		name     string
		sentinel error
		reason   string
		// wantProvisioning, wantReason and wantMessage are the status while the region says no.
		wantProvisioning instance.ProvisioningStatus
		wantReason       string
		wantMessage      string
		// retried says the create is tried again, and succeeds once the region has room.
		retried bool
	}{
		{
			name: "no capacity", sentinel: region.ErrNoCapacity, reason: "the host has 512 MiB of memory free and flavor g1.small needs 4096 MiB",
			wantProvisioning: instance.ProvisioningProvisioning, wantReason: instance.ReasonNoCapacity,
			wantMessage: "The region has no room for the server now: the host has 512 MiB of memory free and flavor g1.small needs 4096 MiB. Retrying.",
			retried:     true,
		},
		{
			name: "refused", sentinel: region.ErrRefused, reason: "image ubuntu-24.04 is missing from the host",
			wantProvisioning: instance.ProvisioningError, wantReason: instance.ReasonErrored,
			wantMessage: "The region refused to create the server: image ubuntu-24.04 is missing from the host.",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts worker.Options
			e := newEnv(t, func(s *setup) {
				s.manual = true
				s.worker.CapacityRetry = capacityRetry
				opts = s.worker
			})
			rc := &refusingCreates{Client: e.region, sentinel: tt.sentinel, reason: tt.reason}
			rec := &recordingStore{}
			reg := e.startWorker(t, opts, rc, rec)
			// The resync's first pass enqueues every instance; once it is over, only the
			// worker's own scheduling reconciles the instance again.
			eventually.Holds(t, convergeLimit, func() bool { return resyncPassed(t, reg) }, "the resync's first pass")

			created := e.create(t, "web-1")
			var inst *instance.Instance
			eventually.Holds(t, convergeLimit, func() bool {
				inst = e.get(t, created.ID)
				return inst.Status.ProvisioningStatus == tt.wantProvisioning && available(t, inst).Reason == tt.wantReason
			}, "instance %s with reason %s, last %s", tt.wantProvisioning, tt.wantReason, last(&inst))
			c := available(t, inst)
			if c.Status != instance.ConditionFalse || c.Message != tt.wantMessage {
				t.Errorf("condition %+v, want %s with message %q", c, instance.ConditionFalse, tt.wantMessage)
			}
			if inst.Status.PowerState != instance.PowerPending {
				t.Errorf("power %s, want %s", inst.Status.PowerState, instance.PowerPending)
			}
			if srvs := e.servers(t, inst); len(srvs) != 0 {
				t.Errorf("servers made although the region said no: %+v", srvs)
			}

			if !tt.retried {
				// The reconcile that wrote ERROR scheduled nothing: the create is not tried again.
				eventually.Holds(t, convergeLimit, func() bool { return e.settled(t, created.Key()) }, "nothing queued for %s", created.Key())
				if n := len(rc.calls()); n != 1 {
					t.Errorf("CreateServer called %d times, want once", n)
				}
				if n := countReason(rec.statuses(), instance.ReasonErrored); n != 1 {
					t.Errorf("%d ERROR statuses written, want 1", n)
				}
				if got := e.get(t, created.ID); got.Status.ProvisioningStatus != instance.ProvisioningError || available(t, got).Message != tt.wantMessage {
					t.Errorf("status changed after the refusal: %s", statusOf(got))
				}
				return
			}

			// Tried again, every CapacityRetry (less the queue's jitter of 20%), not at the
			// pace of the queue's backoff.
			eventually.Holds(t, convergeLimit, func() bool { return len(rc.calls()) >= 3 }, "the create tried 3 times, tried %d", eventually.Lazy(func() string { return fmt.Sprint(len(rc.calls())) }))
			calls := rc.calls()
			for i := 1; i < len(calls); i++ {
				if gap := calls[i].Sub(calls[i-1]); gap < capacityRetry*8/10 {
					t.Errorf("create %d came %s after the one before, want at least %s", i+1, gap, capacityRetry*8/10)
				}
			}
			if st := e.get(t, created.ID).Status; st.ProvisioningStatus != instance.ProvisioningProvisioning {
				t.Errorf("while the region has no room: %+v", st)
			}
			// Saying the same thing again is no change: one status (and one history event)
			// however many times the region said no.
			if n := countReason(rec.statuses(), instance.ReasonNoCapacity); n != 1 {
				t.Errorf("%d statuses with reason %s written over %d tries, want 1", n, instance.ReasonNoCapacity, len(calls))
			}

			rc.open.Store(true)
			inst = e.waitRunning(t, created.ID)
			if c := available(t, inst); c.Status != instance.ConditionTrue || c.Reason != instance.ReasonProvisioned {
				t.Errorf("condition %+v once running, want %s %s", c, instance.ConditionTrue, instance.ReasonProvisioned)
			}
			srv := e.server(t, inst)
			if srv.State != region.ServerRunning || srv.MAC != inst.Status.MACAddress {
				t.Errorf("server %+v, instance %s", srv, statusOf(inst))
			}
			// Exactly one create reached the region, once it had room.
			eventually.Holds(t, convergeLimit, func() bool { return e.settled(t, created.Key()) }, "nothing queued for %s", created.Key())
			if n := rc.made.Load(); n != 1 {
				t.Errorf("%d creates reached the region, want 1", n)
			}
			if n := len(e.servers(t, inst)); n != 1 {
				t.Errorf("%d servers, want 1", n)
			}
			e.wantUsed(t, sum(inst))
		})
	}
}

// countReason counts the statuses whose Available condition has the reason.
func countReason(written []instance.Status, reason string) int {
	n := 0
	for _, st := range written {
		if slices.ContainsFunc(st.Conditions, func(c instance.Condition) bool {
			return c.Type == instance.ConditionAvailable && c.Reason == reason
		}) {
			n++
		}
	}
	return n
}
