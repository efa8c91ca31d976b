package store

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
)

// TestCreateQueuedInOneRoundTrip: with a queue that joins its pipeline, an accepted create
// and the enqueue of its work key are one round trip; a refused create enqueues nothing; a
// Redis that lost the scripts still creates, once, and leaves the enqueue to the caller; a
// store without a queue never enqueues.
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
	calls := &tripHook{}
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
	before := calls.n.Load()
	refusal, queued, err := s.CreateQueued(ctx, accepted, "claim-a", roomy, instance.Idempotency{})
	if err != nil || refusal != nil || !queued {
		t.Fatalf("create: %+v, queued %t, %v; want accepted and queued", refusal, queued, err)
	}
	if n := calls.n.Load() - before; n != 1 {
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

	alone := newInstance("acme", "web", "c")
	if refusal, queued, err := New(rdb).CreateQueued(ctx, alone, "claim-c", roomy, instance.Idempotency{}); err != nil || refusal != nil || queued {
		t.Fatalf("create by a store without a queue: %+v, queued %t, %v; want accepted, not queued", refusal, queued, err)
	}
	if waiting(alone) {
		t.Errorf("a store without a queue enqueued")
	}
}

// tripHook counts round trips to Redis, leaving out a new connection's handshake.
type tripHook struct{ n atomic.Int64 }

func (h *tripHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *tripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "hello" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *tripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() != "client" {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}
