package store

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/redistest"
)

// TestCreateQueuedInOneRoundTrip: with a queue whose keys its script reaches, an accepted
// create and the enqueue of its work key are one script call, in one round trip; a refused
// create enqueues nothing; a Redis that lost the scripts still creates and enqueues, once, and
// the create after it is one round trip again; a store without a queue never enqueues.
func TestCreateQueuedInOneRoundTrip(t *testing.T) {
	rdb, q, s := queuedStore(t)
	calls := &redistest.RoundTrips{}
	rdb.AddHook(calls)
	waiting := func(inst *instance.Instance) bool {
		t.Helper()
		w, err := q.Waiting(ctx, inst.Key())
		if err != nil {
			t.Fatal(err)
		}
		return w
	}

	accepted := newInstance("acme", "web", "a")
	before, commandsBefore := calls.N(), calls.Commands()
	refusal, queued, err := s.CreateQueued(ctx, accepted, "claim-a", roomy, instance.Idempotency{})
	if err != nil || refusal != nil || !queued {
		t.Fatalf("create: %+v, queued %t, %v; want accepted and queued", refusal, queued, err)
	}
	if n, c := calls.N()-before, calls.Commands()-commandsBefore; n != 1 || c != 1 {
		t.Errorf("the create and its enqueue took %d round trips of %d commands, want one of one", n, c)
	}
	if !waiting(accepted) {
		t.Errorf("the created instance's work is not waiting in the queue")
	}

	taken := newInstance("acme", "web", "a")
	refusal, queued, err = s.CreateQueued(ctx, taken, "claim-a", roomy, instance.Idempotency{})
	if err != nil || refusal == nil || !refusal.NameTaken || queued {
		t.Fatalf("create with a taken name: %+v, queued %t, %v; want refused, not queued", refusal, queued, err)
	}
	if waiting(taken) {
		t.Errorf("the refused create's work was enqueued")
	}

	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	lost := newInstance("acme", "web", "b")
	refusal, queued, err = s.CreateQueued(ctx, lost, "claim-b", roomy, instance.Idempotency{})
	if err != nil || refusal != nil || !queued {
		t.Fatalf("create after the scripts were lost: %+v, queued %t, %v; want accepted and queued", refusal, queued, err)
	}
	if got := rdb.Get(ctx, claimKey("acme", "claim-b")).Val(); got != lost.ID {
		t.Errorf("after the scripts were lost the claim holds %q, want %q", got, lost.ID)
	}
	if !waiting(lost) {
		t.Errorf("the work of the instance created after the scripts were lost is not waiting")
	}
	// The scripts are loaded again: the next create is one round trip with its enqueue.
	again := newInstance("acme", "web", "d")
	before = calls.N()
	if refusal, queued, err := s.CreateQueued(ctx, again, "claim-d", roomy, instance.Idempotency{}); err != nil || refusal != nil || !queued {
		t.Fatalf("the next create: %+v, queued %t, %v; want accepted and queued", refusal, queued, err)
	}
	if n := calls.N() - before; n != 1 {
		t.Errorf("the next create and its enqueue took %d round trips, want 1", n)
	}

	alone := newInstance("acme", "web", "c")
	if refusal, queued, err := New(rdb).CreateQueued(ctx, alone, "claim-c", roomy, instance.Idempotency{}); err != nil || refusal != nil || queued {
		t.Fatalf("create by a store without a queue: %+v, queued %t, %v; want accepted, not queued", refusal, queued, err)
	}
	if waiting(alone) {
		t.Errorf("a store without a queue enqueued")
	}
}

// TestCreateQueuedEnqueuesOnlyWhatItStores: the create script enqueues the work of the
// instance it stores, and only then: a create refused by quota or replayed by its idempotency
// key enqueues nothing; and an enqueue that fails (the queue's state a string) leaves the
// instance stored, answered as created and not queued, so that the caller enqueues.
func TestCreateQueuedEnqueuesOnlyWhatItStores(t *testing.T) {
	idem := instance.Idempotency{Key: "key-1", Value: "fingerprint id-1"}
	tests := []struct {
		name string
		// before runs first, on the instance the test creates.
		before     func(t *testing.T, rdb *redis.Client, q *queue.Queue, s *Store, inst *instance.Instance)
		limits     quota.Amounts
		idem       instance.Idempotency
		wantStored bool
		wantQueued bool
		refused    func(*instance.Refusal) bool
	}{{
		name: "accepted", limits: roomy, wantStored: true, wantQueued: true,
	}, {
		name: "refused by quota", limits: quota.Amounts{quota.Servers: 0, quota.CPUs: 100, quota.MemoryGiB: 100},
		refused: func(r *instance.Refusal) bool { return len(r.Exceeded) == 1 && r.Exceeded[0].Kind == quota.Servers },
	}, {
		name: "replayed by its idempotency key", limits: roomy, idem: idem,
		before: func(t *testing.T, _ *redis.Client, _ *queue.Queue, s *Store, _ *instance.Instance) {
			if r, queued, err := s.CreateQueued(ctx, newInstance("acme", "web", "first"), "claim-first", roomy, idem); err != nil || r != nil || !queued {
				t.Fatalf("first create: %+v, queued %t, %v", r, queued, err)
			}
		},
		refused: func(r *instance.Refusal) bool { return r.Replayed == idem.Value },
	}, {
		name: "its enqueue fails", limits: roomy, wantStored: true,
		before: func(t *testing.T, rdb *redis.Client, q *queue.Queue, _ *Store, inst *instance.Instance) {
			add, err := q.Addition(ctx, inst.Key())
			if err != nil {
				t.Fatal(err)
			}
			if err := rdb.Set(ctx, add.Keys[1], "not a hash", 0).Err(); err != nil {
				t.Fatal(err)
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb, q, s := queuedStore(t)
			inst := newInstance("acme", "web", "a")
			if tt.before != nil {
				tt.before(t, rdb, q, s, inst)
			}
			refusal, queued, err := s.CreateQueued(ctx, inst, "claim-a", tt.limits, tt.idem)
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			if tt.refused == nil && refusal != nil || tt.refused != nil && (refusal == nil || !tt.refused(refusal)) {
				t.Errorf("refusal %+v", refusal)
			}
			if queued != tt.wantQueued {
				t.Errorf("queued %t, want %t", queued, tt.wantQueued)
			}
			stored := rdb.Exists(ctx, instanceKey("acme", inst.ID)).Val() == 1
			if stored != tt.wantStored {
				t.Errorf("the instance stored: %t, want %t", stored, tt.wantStored)
			}
			add, err := q.Addition(ctx, inst.Key())
			if err != nil {
				t.Fatal(err)
			}
			entries, err := rdb.XRange(ctx, add.Keys[0], "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			messages := 0
			for _, e := range entries {
				if e.Values["k"] == inst.Key() {
					messages++
				}
			}
			if want := map[bool]int{true: 1}[tt.wantQueued]; messages != want {
				t.Errorf("the queue holds %d messages of the instance's key, want %d", messages, want)
			}
		})
	}
}

// TestConcurrentCreatesShareRoundTrips: while createTrips creates are under way, the creates
// that come wait and go together in one pipeline; each still gets its own answer: of two
// creates of one name exactly one is accepted and enqueued, the other refused and not.
func TestConcurrentCreatesShareRoundTrips(t *testing.T) {
	rdb, q, s := queuedStore(t)
	gate := &pipelineGate{open: make(chan struct{}), entered: make(chan struct{}, 100)}
	rdb.AddHook(gate)
	calls := &redistest.RoundTrips{}
	rdb.AddHook(calls)

	type outcome struct {
		inst    *instance.Instance
		refusal *instance.Refusal
		queued  bool
	}
	const distinct = 20
	outcomes := make(chan outcome, 2*distinct)
	var wg sync.WaitGroup
	create := func(name string) {
		wg.Go(func() {
			inst := newInstance("acme", "web", name)
			refusal, queued, err := s.CreateQueued(ctx, inst, "claim-"+name, roomy, instance.Idempotency{})
			if err != nil {
				t.Errorf("create %s: %v", name, err)
			}
			outcomes <- outcome{inst, refusal, queued}
		})
	}
	for i := range createTrips {
		create(fmt.Sprint("n", i))
	}
	for range createTrips {
		select {
		case <-gate.entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the first creates did not each make a round trip")
		}
	}
	// The rest of the names, then every name again.
	for i := createTrips; i < 2*distinct; i++ {
		create(fmt.Sprint("n", i%distinct))
	}
	waiting := 2*distinct - createTrips
	eventually.Holds(t, 10*time.Second, func() bool { return s.creates.Waiting() == waiting }, "the later creates waiting")
	before := calls.N()
	close(gate.open)
	wg.Wait()
	close(outcomes)
	if n := calls.N() - before; n != createTrips+1 {
		t.Errorf("%d creates took %d round trips, want %d: one each for the first, one shared", 2*distinct, n, createTrips+1)
	}
	accepted := map[string]int{}
	for o := range outcomes {
		w, err := q.Waiting(ctx, o.inst.Key())
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case o.refusal == nil && o.queued && w:
			accepted[o.inst.Name]++
		case o.refusal != nil && o.refusal.NameTaken && !o.queued && !w:
		default:
			t.Errorf("create %s: refusal %+v, queued %t, waiting %t", o.inst.Name, o.refusal, o.queued, w)
		}
	}
	for i := range distinct {
		if n := accepted[fmt.Sprint("n", i)]; n != 1 {
			t.Errorf("name n%d accepted %d times, want once", i, n)
		}
	}
}

// queuedStore is a store on a fresh database whose create script enqueues too.
func queuedStore(t *testing.T) (*redis.Client, *queue.Queue, *Store) {
	t.Helper()
	rdb := redisServer.Client(t)
	q, err := queue.New(rdb, queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	s := New(rdb, WithQueue(q))
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	return rdb, q, s
}

// pipelineGate holds pipelines until open is closed; entered receives one value per pipeline
// held.
type pipelineGate struct {
	open    chan struct{}
	entered chan struct{}
}

func (g *pipelineGate) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (g *pipelineGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (g *pipelineGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.entered <- struct{}{}
		<-g.open
		return next(ctx, cmds)
	}
}
