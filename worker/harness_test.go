package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
	"github.com/computeql/computeql/store"
	"github.com/computeql/computeql/worker"
)

var redisServer *redistest.Server

// TestMain owns the real redis-server every test of the package runs against.
func TestMain(m *testing.M) { redistest.Main(m, &redisServer) }

// convergeLimit bounds how long any convergence may take; in practice it is well under a
// second, so hitting it means something is stuck.
const convergeLimit = 10 * time.Second

// admin is an organization-wide admin of acme, the principal of every API call.
var admin = auth.WithPrincipal(context.Background(), auth.Principal{
	Subject: "ada", Grants: []auth.Grant{{OrganizationID: "acme", Role: auth.RoleAdmin}},
})

// bg is the context of the test's own reads and writes.
var bg = context.Background()

// setup is what a test changes of the environment before it is built.
type setup struct {
	sim    sim.Options
	queue  queue.Options
	worker worker.Options
	// serviceQueue, when set, is the queue the API service enqueues on instead of the real one.
	serviceQueue instance.Queue
	// store, when set, wraps the store the worker uses.
	store func(worker.Store) worker.Store
	// manual leaves the region's clock and the worker to be started by the test.
	manual bool
}

// env is a simulated region, an API service and a worker over one freshly flushed real Redis.
type env struct {
	rdb *redis.Client
	st  *store.Store
	q   *queue.Queue
	// region is the simulated region the worker talks to, faults included.
	region *sim.Sim
	// probe is the same region (the same Redis state) without faults: the test's own eyes.
	probe *sim.Sim
	svc   *instance.Service
	reg   *prometheus.Registry
	wk    *worker.Worker
	cat   *region.Catalog
	// consumerOptions are the consumer options the worker was built with.
	consumerOptions queue.ConsumerOptions

	clock, work *running
}

// newEnv builds an environment; unless s.manual, the region's clock and the worker run until
// the test ends.
func newEnv(t *testing.T, edit ...func(s *setup)) *env {
	t.Helper()
	cat := region.Demo()
	s := setup{
		sim:   sim.Options{Catalog: cat, Tick: 5 * time.Millisecond},
		queue: queue.Options{Shards: 4},
		worker: worker.Options{
			Concurrency: 4, Yield: 50 * time.Millisecond,
			Consumer: queue.ConsumerOptions{
				Lease: 2 * time.Second, Block: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond,
				BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
			},
		},
	}
	for _, f := range edit {
		f(&s)
	}
	e := &env{rdb: redisServer.Client(t), cat: cat, reg: prometheus.NewRegistry(), consumerOptions: s.worker.Consumer}
	e.st = store.New(e.rdb)
	var err error
	if e.q, err = queue.New(e.rdb, s.queue); err != nil {
		t.Fatal(err)
	}
	if err := e.q.Setup(bg); err != nil {
		t.Fatal(err)
	}
	if e.region, err = sim.New(e.rdb, s.sim); err != nil {
		t.Fatal(err)
	}
	probeOpts := s.sim
	probeOpts.Faults = sim.Faults{}
	if e.probe, err = sim.New(e.rdb, probeOpts); err != nil {
		t.Fatal(err)
	}
	var svcQueue instance.Queue = e.q
	if s.serviceQueue != nil {
		svcQueue = s.serviceQueue
	}
	if e.svc, err = instance.NewService(instance.Options{Catalog: cat, Store: e.st, Queue: svcQueue, Region: e.region, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	wo := s.worker
	var ws worker.Store = e.st
	if s.store != nil {
		ws = s.store(ws)
	}
	wo.Store, wo.Region, wo.Queue, wo.Registerer = ws, e.region, e.q, e.reg
	if wo.Logger == nil {
		wo.Logger = quiet
	}
	wo.Organizations = func() []string { return []string{"acme", "globex"} }
	if wo.NetworkExists == nil {
		wo.NetworkExists = func(id string) bool { _, ok := cat.Network(id); return ok }
	}
	if e.wk, err = worker.New(wo); err != nil {
		t.Fatal(err)
	}
	if !s.manual {
		e.start(t)
	}
	return e
}

var quiet = slog.New(slog.DiscardHandler)

// start runs the region's clock and the worker until the test ends (or stop).
func (e *env) start(t *testing.T) {
	t.Helper()
	e.clock = goRun(t, "region clock", e.region.Run)
	e.work = goRun(t, "worker", e.wk.Start)
}

// running is a component's Start (or Run) on its own goroutine.
type running struct {
	name   string
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// goRun runs f until stop or the end of the test; at the end it must have returned nil.
func goRun(t *testing.T, name string, f func(context.Context) error) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{name: name, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- f(ctx) }()
	t.Cleanup(func() {
		if err := r.stop(15 * time.Second); err != nil {
			t.Error(err)
		}
	})
	return r
}

// stop cancels the component and waits up to limit for it to return; it reports a component
// that did not return in time or returned an error.
func (r *running) stop(limit time.Duration) error {
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				r.err = fmt.Errorf("%s returned %v", r.name, err)
			}
		case <-time.After(limit):
			r.err = fmt.Errorf("%s did not return within %s of its context ending", r.name, limit)
		}
	})
	return r.err
}

// last renders the status of the instance *p holds when a failure message is printed.
func last(p **instance.Instance) eventually.Lazy { return func() string { return statusOf(*p) } }

// createReq is a valid request for an instance named name in acme/web (EU West).
func createReq(name string) instance.CreateRequest {
	return instance.CreateRequest{
		OrganizationID: "acme", ProjectID: "web", NetworkID: "net-acme-web-eu",
		Name: name, FlavorID: "g1.small", ImageID: "ubuntu-24.04",
	}
}

func ptr[T any](v T) *T { return &v }

// withPublicIP asks for a public IP.
func withPublicIP(r *instance.CreateRequest) {
	if r.Networking == nil {
		r.Networking = &instance.NetworkingRequest{}
	}
	r.Networking.PublicIP = ptr(true)
}

// create creates an instance through the API service; it must be accepted.
func (e *env) create(t *testing.T, name string, edit ...func(*instance.CreateRequest)) *instance.Instance {
	t.Helper()
	req := createReq(name)
	for _, f := range edit {
		f(&req)
	}
	inst, err := e.svc.Create(admin, req)
	if err != nil {
		t.Fatalf("create %q: %v", name, err)
	}
	return inst
}

// update updates an instance through the API service; it must be accepted.
func (e *env) update(t *testing.T, req instance.UpdateRequest) *instance.Instance {
	t.Helper()
	inst, err := e.svc.Update(admin, req)
	if err != nil {
		t.Fatalf("update %s: %v", req.ID, err)
	}
	return inst
}

// lookup reads an instance from the store; (nil, nil) when it is gone.
func (e *env) lookup(t *testing.T, id string) *instance.Instance {
	t.Helper()
	inst, err := e.st.Get(bg, []string{"acme"}, id)
	if errors.Is(err, instance.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return inst
}

// get reads an instance that must exist.
func (e *env) get(t *testing.T, id string) *instance.Instance {
	t.Helper()
	inst := e.lookup(t, id)
	if inst == nil {
		t.Fatalf("instance %s is gone", id)
	}
	return inst
}

// servers returns the servers carrying the instance's tag, looked up without faults.
func (e *env) servers(t *testing.T, inst *instance.Instance) []region.Server {
	t.Helper()
	srvs, err := e.probe.FindServers(bg, inst.Scope(), region.InstanceTag, inst.ID)
	if err != nil {
		t.Fatalf("find servers of %s: %v", inst.ID, err)
	}
	return srvs
}

// server returns the one server of the instance.
func (e *env) server(t *testing.T, inst *instance.Instance) region.Server {
	t.Helper()
	srvs := e.servers(t, inst)
	if len(srvs) != 1 {
		t.Fatalf("instance %s has %d servers, want 1: %+v", inst.ID, len(srvs), srvs)
	}
	return srvs[0]
}

// converged reports whether the instance runs with its current generation realised.
func converged(inst *instance.Instance) bool {
	if inst == nil {
		return false
	}
	st := inst.Status
	return st.ProvisioningStatus == instance.ProvisioningProvisioned &&
		st.PowerState == instance.PowerRunning && st.ObservedGeneration == inst.Generation
}

// waitRunning waits until the instance runs with its current generation realised.
func (e *env) waitRunning(t *testing.T, id string) *instance.Instance {
	t.Helper()
	var inst *instance.Instance
	eventually.Holds(t, convergeLimit, func() bool {
		inst = e.lookup(t, id)
		return converged(inst)
	}, "instance %s RUNNING, last %s", id, last(&inst))
	return inst
}

// waitGone waits until the instance is forgotten.
func (e *env) waitGone(t *testing.T, id string) {
	t.Helper()
	eventually.Holds(t, convergeLimit, func() bool { return e.lookup(t, id) == nil }, "instance %s forgotten", id)
}

// statusOf renders an instance's status for failure messages.
func statusOf(inst *instance.Instance) string {
	if inst == nil {
		return "<none>"
	}
	return fmt.Sprintf("gen %d %+v", inst.Generation, inst.Status)
}

// available returns the instance's Available condition.
func available(t *testing.T, inst *instance.Instance) instance.Condition {
	t.Helper()
	i := slices.IndexFunc(inst.Status.Conditions, func(c instance.Condition) bool { return c.Type == instance.ConditionAvailable })
	if i < 0 {
		t.Fatalf("instance %s has no %s condition: %+v", inst.ID, instance.ConditionAvailable, inst.Status)
	}
	return inst.Status.Conditions[i]
}

// used returns acme's quota usage.
func (e *env) used(t *testing.T) quota.Amounts {
	t.Helper()
	_, used, err := e.st.Quota(bg, "acme")
	if err != nil {
		t.Fatal(err)
	}
	return used
}

// wantUsed asserts acme's usage of every kind (kinds left out must be zero).
func (e *env) wantUsed(t *testing.T, want quota.Amounts) {
	t.Helper()
	used := e.used(t)
	for _, k := range quota.Kinds {
		if used[k] != want[k] {
			t.Errorf("acme used %s = %d, want %d", k, used[k], want[k])
		}
	}
}

// sum adds the charges of the instances.
func sum(insts ...*instance.Instance) quota.Amounts {
	out := quota.Amounts{}
	for _, inst := range insts {
		for k, v := range inst.Charge {
			out[k] += v
		}
	}
	return out
}

// droppingQueue loses every key: an API process that crashed between its store write and its
// enqueue.
type droppingQueue struct{}

func (droppingQueue) Enqueue(context.Context, string) error { return nil }

// recordingStore is the worker's store, remembering every status it wrote: states that last
// only a moment can be checked afterwards.
type recordingStore struct {
	worker.Store
	mu      sync.Mutex
	written []instance.Status
}

func (s *recordingStore) WriteStatus(ctx context.Context, inst *instance.Instance, st instance.Status, ev instance.Event) (bool, error) {
	ok, err := s.Store.WriteStatus(ctx, inst, st, ev)
	if ok {
		s.mu.Lock()
		s.written = append(s.written, st)
		s.mu.Unlock()
	}
	return ok, err
}

// statuses returns the statuses written so far.
func (s *recordingStore) statuses() []instance.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.written)
}
