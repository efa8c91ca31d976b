// Package queue is the work queue workers consume: opaque keys on sharded Redis Streams, with
// consumer groups, at-least-once delivery, one handler per key at a time, coalescing, delayed
// runs, per-key backoff and dead letters. It knows nothing of what a key names.
//
// A key's life: Enqueue appends a message for an idle key (a key already waiting is left alone;
// a key being handled is marked to run once more afterwards). A consumer reads the message,
// begins (a fencing token is handed out and the delivery counted), runs the handler while
// renewing its lease, and finishes (acknowledges and deletes the message, then adds the key
// again or schedules it). A consumer that dies leaves its message pending; another reclaims it
// once it has been idle longer than the lease.
package queue

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/computeql/computeql/roundtrip"
)

// Options configure a Queue. Every process of a deployment must use the same Shards and Group.
type Options struct {
	// Shards is how many streams keys are spread over. Defaults to 16.
	Shards int
	// Group is the consumer group. Defaults to "workers".
	Group string
	// MaxDeliveries is how often a key may be delivered without succeeding before it is
	// dead-lettered; deliveries to consumers that died count. Defaults to 10.
	MaxDeliveries int
	// DeadLetterMaxLen caps each shard's dead-letter stream (approximately). Defaults to 100,000.
	DeadLetterMaxLen int64
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Propagator writes the trace context of the span in Enqueue's context into the message
	// and reads it back for the handler, so that a run joins the trace of the request that
	// asked for it. Defaults to OpenTelemetry's global propagator, which carries nothing until
	// tracing is set up.
	Propagator propagation.TextMapPropagator
}

func (o *Options) applyDefaults() error {
	if o.Shards == 0 {
		o.Shards = 16
	}
	if o.Shards < 1 || o.Shards > 1024 {
		return errors.New("queue: Shards must be between 1 and 1024")
	}
	if o.Group == "" {
		o.Group = "workers"
	}
	if o.MaxDeliveries == 0 {
		o.MaxDeliveries = 10
	}
	if o.MaxDeliveries < 1 {
		return errors.New("queue: MaxDeliveries must be at least 1")
	}
	if o.DeadLetterMaxLen == 0 {
		o.DeadLetterMaxLen = 100_000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Propagator == nil {
		o.Propagator = otel.GetTextMapPropagator()
	}
	return nil
}

// Queue adds keys and manages dead letters. It is safe for concurrent use.
type Queue struct {
	rdb  redis.UniversalClient
	opts Options
	keys []shardKeys // by shard
	// adds carries the Enqueues: at most maxAdds round trips at once, then shared ones.
	adds *roundtrip.Shared[*addReq]
}

// New returns a queue on the client with opts' defaults applied.
func New(rdb redis.UniversalClient, opts Options) (*Queue, error) {
	if err := opts.applyDefaults(); err != nil {
		return nil, err
	}
	q := &Queue{rdb: rdb, opts: opts, keys: make([]shardKeys, opts.Shards)}
	q.adds = roundtrip.Share(maxAdds, q.addOne, q.add)
	for shard := range q.keys {
		q.keys[shard] = newShardKeys(shard, q.fenceKeyOf(shard))
	}
	return q, nil
}

// Shard returns the shard a key always maps to.
func (q *Queue) Shard(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(q.opts.Shards))
}

// Setup creates every shard's stream and consumer group if they do not exist, and loads the
// scripts. It is idempotent, so every process may call it at start.
func (q *Queue) Setup(ctx context.Context) error {
	for shard := range q.opts.Shards {
		// Reading from "0" keeps messages appended before the group existed.
		err := q.rdb.XGroupCreateMkStream(ctx, streamKey(shard), q.opts.Group, "0").Err()
		if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
			return fmt.Errorf("queue setup: shard %d: %w", shard, err)
		}
	}
	for _, sc := range scripts {
		if err := sc.Load(ctx, q.rdb).Err(); err != nil {
			return fmt.Errorf("queue setup: load scripts: %w", err)
		}
	}
	if err := q.raiseFences(ctx); err != nil {
		return fmt.Errorf("queue setup: %w", err)
	}
	return nil
}

// raiseFences brings every shard's fence counter up to the highest: fences must go on
// increasing for a shard's keys when a deployment moves between a standalone Redis, where
// every shard counts on shard 0's counter, and a Redis Cluster, where each counts on its own.
func (q *Queue) raiseFences(ctx context.Context) error {
	counts := make([]*redis.StringCmd, q.opts.Shards)
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for shard := range counts {
			counts[shard] = p.Get(ctx, fenceKey(shard))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("read fence counters: %w", err)
	}
	var top int64
	for _, c := range counts {
		n, _ := c.Int64() // a counter never written is 0
		top = max(top, n)
	}
	if top == 0 {
		return nil
	}
	_, err = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for shard := range counts {
			raiseScript.Eval(ctx, p, []string{fenceKey(shard)}, top)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("raise fence counters: %w", err)
	}
	return nil
}

// Enqueue adds the key to be handled as soon as a consumer is free. Adding a key that is
// already waiting does nothing; adding one that is being handled makes it run exactly once
// more after the current run, which then sees the newest state.
//
// A new message carries the trace context of ctx's span, if there is one. Runs the queue
// starts by itself (the follow-up of a key added while it was handled, delayed runs, retries,
// requeued dead letters) carry none and begin traces of their own.
//
// Up to four Enqueues at a time make a round trip each, which ends with the caller's context;
// those made while four are under way share the next one: one script call adds them all, and
// no one caller's context cuts it short. An Enqueue whose context ends while its key is on its
// way returns the context's error, and the key may be added all the same.
func (q *Queue) Enqueue(ctx context.Context, key string) error {
	r := &addReq{shard: q.Shard(key), key: key, fields: q.traceFields(ctx)}
	err := q.adds.Do(ctx, r)
	if err == nil {
		err = r.err
	}
	if err != nil {
		return fmt.Errorf("enqueue %s: %w", key, err)
	}
	return nil
}

// addReq is the key of an Enqueue; err receives Redis's answer.
type addReq struct {
	shard  int
	key    string
	fields []any
	err    error
}

// maxAdds bounds the enqueue round trips one Queue has under way. Up to it, each Enqueue
// makes its own, so that a few callers adding at once do not wait in line for one another's
// replies (a single round trip at a time capped a queue's adds at a few keys per round trip
// time); past it, callers share the next round trip in batches, so that a flood of callers
// costs Redis a bounded number of round trips instead of one each.
const maxAdds = 4

// addOne adds one key in a round trip of its own, with the one-key script.
func (q *Queue) addOne(ctx context.Context, r *addReq) {
	r.err = enqueueOneScript.Run(ctx, q.rdb, q.keys[r.shard].enqueue, append([]any{r.key}, r.fields...)...).Err()
}

// add runs the enqueue script for the waiting keys in one round trip.
func (q *Queue) add(ctx context.Context, reqs []*addReq) {
	var order []*addReq
	calls := batch(q, reqs, func(r *addReq) int { return r.shard },
		func() []any { return nil },
		func(shard int) []string { return q.keys[shard].enqueue },
		func(args []any, r *addReq) []any {
			order = append(order, r)
			return append(append(args, r.key, len(r.fields)), r.fields...)
		})
	q.runCalls(ctx, enqueueScript, calls)
	for _, call := range calls {
		err := call.cmd.Err()
		for _, r := range order[:call.n] {
			r.err = err
		}
		order = order[call.n:]
	}
}

// Backlog is one shard's work as Redis holds it.
type Backlog struct {
	// Depth counts the stream's messages: waiting or being handled.
	Depth int64
	// Pending counts messages delivered to a consumer and not finished, and PendingBy splits
	// them by consumer name.
	Pending   int64
	PendingBy map[string]int64
	// Delayed counts keys scheduled to run later; Dead the dead letters kept.
	Delayed, Dead int64
}

// Backlog reads every shard's backlog, index by shard, in one pipelined round trip.
func (q *Queue) Backlog(ctx context.Context) ([]Backlog, error) {
	type shardCmds struct {
		depth, delayed, dead *redis.IntCmd
		pending              *redis.XPendingCmd
	}
	cmds := make([]shardCmds, q.opts.Shards)
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for shard := range cmds {
			cmds[shard] = shardCmds{
				depth:   p.XLen(ctx, streamKey(shard)),
				pending: p.XPending(ctx, streamKey(shard), q.opts.Group),
				delayed: p.ZCard(ctx, delayedKey(shard)),
				dead:    p.XLen(ctx, deadKey(shard)),
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("queue backlog: %w", err)
	}
	out := make([]Backlog, len(cmds))
	for shard, c := range cmds {
		p := c.pending.Val()
		out[shard] = Backlog{Depth: c.depth.Val(), Pending: p.Count, PendingBy: p.Consumers, Delayed: c.delayed.Val(), Dead: c.dead.Val()}
	}
	return out, nil
}

// Waiting reports whether a message for the key waits in the queue or is being handled.
func (q *Queue) Waiting(ctx context.Context, key string) (bool, error) {
	st, err := q.rdb.HGet(ctx, stateKey(q.Shard(key)), key).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("waiting %s: %w", key, err)
	}
	return st != scheduled && st != scheduledFailed, nil
}

// ErrOtherShards: on a Redis Cluster the queue's keys live on other shards than a caller's,
// so no script of the caller's can reach them (Addition).
var ErrOtherShards = errors.New("the queue's keys are on other Redis Cluster shards")

// Addition is the enqueue of a key as a script of another package makes it, with EnqueueLua
// defined in it: enqueue(Keys[1], Keys[2], Keys[3], Args...). Made in the script that writes
// what the key's work is for (a create's record), the write and its work are one atomic step,
// in one round trip, and a refused write adds nothing.
type Addition struct {
	// Keys are the queue's, three: the key's shard's stream, state and delayed set. They are
	// the queue's own; append them to the script's keys, never write to them.
	Keys []string
	// Args are the key and the adder's trace fields (field/value pairs, stored with the message).
	Args []any
}

// Addition returns the enqueue of key for a script of another package, as Enqueue would
// make it; on a Redis Cluster, ErrOtherShards.
func (q *Queue) Addition(ctx context.Context, key string) (Addition, error) {
	if q.cluster() {
		return Addition{}, ErrOtherShards
	}
	return Addition{Keys: q.keys[q.Shard(key)].enqueue, Args: append([]any{key}, q.traceFields(ctx)...)}, nil
}

// EnqueueAfter adds the key after d. A key already scheduled earlier keeps the earlier time.
func (q *Queue) EnqueueAfter(ctx context.Context, key string, d time.Duration) error {
	shard := q.Shard(key)
	at := q.opts.Now().Add(d).UnixMilli()
	if err := enqueueAfterScript.Run(ctx, q.rdb, []string{delayedKey(shard), stateKey(shard)}, key, at).Err(); err != nil {
		return fmt.Errorf("enqueue %s after %s: %w", key, d, err)
	}
	return nil
}

// DeadLetter is a key that was given up on.
type DeadLetter struct {
	// ID identifies the dead letter for Requeue.
	ID       string
	Key      string
	Reason   string
	Attempts int
	At       time.Time
}

// DeadLetters lists up to limit dead letters of every shard, oldest first within a shard.
func (q *Queue) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	var out []DeadLetter
	for shard := range q.opts.Shards {
		if len(out) >= limit {
			break
		}
		msgs, err := q.rdb.XRangeN(ctx, deadKey(shard), "-", "+", int64(limit-len(out))).Result()
		if err != nil {
			return nil, fmt.Errorf("list dead letters: %w", err)
		}
		for _, m := range msgs {
			out = append(out, parseDeadLetter(shard, m))
		}
	}
	return out, nil
}

func parseDeadLetter(shard int, m redis.XMessage) DeadLetter {
	str := func(k string) string { s, _ := m.Values[k].(string); return s }
	d := DeadLetter{ID: fmt.Sprintf("%d/%s", shard, m.ID), Key: str("k"), Reason: str("reason")}
	fmt.Sscan(str("attempts"), &d.Attempts)
	var ms int64
	fmt.Sscan(str("at"), &ms)
	d.At = time.UnixMilli(ms)
	return d
}

// Requeue moves a dead letter back onto the queue. Its key starts afresh: its deliveries
// were reset when it was dead-lettered.
func (q *Queue) Requeue(ctx context.Context, id string) (key string, err error) {
	var shard int
	var msgID string
	if n, _ := fmt.Sscanf(strings.Replace(id, "/", " ", 1), "%d %s", &shard, &msgID); n != 2 || shard < 0 || shard >= q.opts.Shards {
		return "", fmt.Errorf("requeue: %q is not a dead-letter id", id)
	}
	key, err = requeueDeadScript.Run(ctx, q.rdb, []string{streamKey(shard), stateKey(shard), deadKey(shard), delayedKey(shard)}, msgID).Text()
	if errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("requeue: no dead letter %s", id)
	}
	if err != nil {
		return "", fmt.Errorf("requeue %s: %w", id, err)
	}
	return key, nil
}

// fenceKeyOf is the fence counter the runs of the shard count on: on a standalone Redis one
// for every shard, so that one INCRBY serves a call's messages of every shard; on a Redis
// Cluster, which refuses a script whose keys span slots, the shard's own.
func (q *Queue) fenceKeyOf(shard int) string {
	if q.cluster() {
		return fenceKey(shard)
	}
	return fenceKey(0)
}

// cluster reports whether the client is a Redis Cluster's, which refuses a command (or script)
// whose keys span hash slots, and so shards.
func (q *Queue) cluster() bool {
	_, ok := q.rdb.(*redis.ClusterClient)
	return ok
}

// scriptCall is one call of a script that works on a batch of items: its keys and arguments,
// how many items it carries, and, once run, its reply.
type scriptCall struct {
	keys []string
	args []any
	n    int
	cmd  *redis.Cmd
}

// batch groups items by shard into script calls, in the order the script replies: one call
// with every shard's keys on a standalone Redis, one per shard on a cluster. head gives a
// call's leading arguments and keys a shard's keys; each shard's arguments are its number of
// items, then what add appends for each item.
func batch[T any](q *Queue, items []T, shardOf func(T) int, head func() []any, keys func(shard int) []string, add func(args []any, item T) []any) []*scriptCall {
	byShard := map[int][]T{}
	var order []int
	for _, it := range items {
		s := shardOf(it)
		if _, seen := byShard[s]; !seen {
			order = append(order, s)
		}
		byShard[s] = append(byShard[s], it)
	}
	var calls []*scriptCall
	for _, s := range order {
		if len(calls) == 0 || q.cluster() {
			calls = append(calls, &scriptCall{args: head()})
		}
		call := calls[len(calls)-1]
		if call.keys == nil {
			call.keys = keys(s) // clipped: a second shard's keys are appended to a copy
		} else {
			call.keys = append(call.keys, keys(s)...)
		}
		call.args = append(call.args, len(byShard[s]))
		for _, it := range byShard[s] {
			call.args = add(call.args, it)
			call.n++
		}
	}
	return calls
}

// runCalls runs the script's calls in one round trip.
func (q *Queue) runCalls(ctx context.Context, sc *redis.Script, calls []*scriptCall) {
	if len(calls) == 1 {
		calls[0].cmd = sc.Run(ctx, q.rdb, calls[0].keys, calls[0].args...)
		return
	}
	_, _ = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, call := range calls {
			call.cmd = sc.EvalSha(ctx, p, call.keys, call.args...)
		}
		return nil
	})
	for _, call := range calls {
		if redis.HasErrorPrefix(call.cmd.Err(), "NOSCRIPT") {
			// In a pipeline a script Redis lost (a restart, a failover) is not loaded by
			// itself; Run loads it, and the pipelined call had done nothing.
			call.cmd = sc.Run(ctx, q.rdb, call.keys, call.args...)
		}
	}
}
