package store

import (
	"testing"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/redistest"
)

// TestCreateQueuedInOneRoundTrip: with a queue that joins its pipeline, an accepted create
// and the enqueue of its work key are one round trip; a refused create enqueues nothing; a
// Redis that lost the scripts still creates, once, and leaves the enqueue to the caller, and
// the create after it is one round trip again; a store without a queue never enqueues.
func TestCreateQueuedInOneRoundTrip(t *testing.T) {
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
	before := calls.N()
	refusal, queued, err := s.CreateQueued(ctx, accepted, "claim-a", roomy, instance.Idempotency{})
	if err != nil || refusal != nil || !queued {
		t.Fatalf("create: %+v, queued %t, %v; want accepted and queued", refusal, queued, err)
	}
	if n := calls.N() - before; n != 1 {
		t.Errorf("the create and its enqueue took %d round trips, want 1", n)
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
	if err != nil || refusal != nil || queued {
		t.Fatalf("create after the scripts were lost: %+v, queued %t, %v; want accepted, not queued", refusal, queued, err)
	}
	if got := rdb.Get(ctx, claimKey("acme", "claim-b")).Val(); got != lost.ID {
		t.Errorf("after the scripts were lost the claim holds %q, want %q", got, lost.ID)
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
