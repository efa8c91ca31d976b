package queue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
)

// Task is one run of a handler for a key.
type Task struct {
	Key string
	// Fence increases with every delivery of any key of the shard (on a standalone Redis, of any
	// key of the queue). A handler passes it on to its writes so that a stale run (one whose
	// lease was lost) can be refused by them.
	Fence int64
	// Attempt counts deliveries of the key since it last succeeded, starting at 1.
	Attempt int
}

// Handler handles a key. The contract:
//
//   - It is level-based and idempotent: it is told only the key, reads the current state and
//     closes the gap; it may see a key again that it already handled (at-least-once).
//   - (0, nil): done.
//   - (d, nil) with d > 0: poll, run again after about d (jittered). Not a failure.
//   - (_, err): failed, run again after a per-key exponential backoff. Failures and deliveries
//     to consumers that died count toward MaxDeliveries; past it the key is dead-lettered.
//   - (_, Terminal(err)): record and stop: the key is dead-lettered at once.
//
// The context ends when the consumer shuts down past its deadline or loses the lease; a
// handler must then return promptly, and its result is discarded. Start waits for every
// handler to return, so one that ignores its context holds shutdown up.
type Handler interface {
	Handle(ctx context.Context, t Task) (again time.Duration, err error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, t Task) (time.Duration, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, t Task) (time.Duration, error) { return f(ctx, t) }

type terminalError struct{ err error }

func (e terminalError) Error() string { return e.err.Error() }
func (e terminalError) Unwrap() error { return e.err }

// Terminal marks an error after which retrying is pointless: the key is dead-lettered.
func Terminal(err error) error { return terminalError{err} }

// ConsumerOptions configure a Consumer.
type ConsumerOptions struct {
	// Name identifies the consumer in the group; it must be unique among live consumers.
	// Defaults to host-pid-random.
	Name string
	// Concurrency is how many handlers run at once. Defaults to 4.
	Concurrency int
	// Lease is how long a message may go unrenewed before another consumer reclaims it.
	// Handlers renew it every Lease/3 while they run. Defaults to 30s.
	Lease time.Duration
	// Block is how long one read waits for messages; it bounds how long shutdown waits for
	// readers. Defaults to 1s.
	Block time.Duration
	// PollInterval is how often due delayed keys are moved onto the streams, and so how late
	// they can be. Defaults to 100ms.
	PollInterval time.Duration
	// BackoffBase is the delay after a first failure; it doubles with every further one.
	// Defaults to 200ms.
	BackoffBase time.Duration
	// BackoffMax caps the backoff. Defaults to 5m.
	BackoffMax time.Duration
	// Jitter spreads delays by up to this fraction either way, so keys that failed together do
	// not retry together. Defaults to 0.2.
	Jitter float64
	// ShutdownTimeout is how long in-flight handlers may take to finish once shutdown starts;
	// past it they are cancelled and their messages left pending for others. Defaults to 10s.
	ShutdownTimeout time.Duration
	// DeadConsumerAfter is how long a consumer holding no messages may be idle before it is
	// removed from the group. Defaults to 10m.
	DeadConsumerAfter time.Duration
	// OnDeadLetter is called after a key was dead-lettered, e.g. to mark what it names failed.
	OnDeadLetter func(ctx context.Context, key, reason string)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the consumer's metrics. Defaults to none.
	Registerer prometheus.Registerer
	// TracerProvider, when set, gets a "queue.handle" span for every message handled, from
	// begin to finish, in the trace its message carries. Defaults to none: no spans, though a
	// carried trace context still reaches the handler.
	TracerProvider trace.TracerProvider
}

func (o *ConsumerOptions) applyDefaults() error {
	if o.Name == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		o.Name = host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b)
	}
	defaults := []struct {
		d   *time.Duration
		def time.Duration
	}{
		{&o.Lease, 30 * time.Second}, {&o.Block, time.Second}, {&o.PollInterval, 100 * time.Millisecond},
		{&o.BackoffBase, 200 * time.Millisecond}, {&o.BackoffMax, 5 * time.Minute},
		{&o.ShutdownTimeout, 10 * time.Second}, {&o.DeadConsumerAfter, 10 * time.Minute},
	}
	for _, d := range defaults {
		if *d.d == 0 {
			*d.d = d.def
		}
		if *d.d < 0 {
			return errors.New("queue: durations must not be negative")
		}
	}
	if o.Concurrency == 0 {
		o.Concurrency = 4
	}
	if o.Concurrency < 1 {
		return errors.New("queue: Concurrency must be at least 1")
	}
	if o.Jitter == 0 {
		o.Jitter = 0.2
	}
	if o.Jitter < 0 || o.Jitter >= 1 {
		return errors.New("queue: Jitter must be in [0, 1)")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Consumer handles keys of every shard with a pool of handlers.
type Consumer struct {
	q       *Queue
	h       Handler
	opts    ConsumerOptions
	metrics *consumerMetrics
	tracer  trace.Tracer // nil: no spans

	// room holds a token per message the consumer may still take: twice its handlers, so that
	// the next batch is taken while one is handled, and at least one per shard, so that a
	// read can take the next message of every shard at once. A taken message waits for a
	// handler at most about one batch long, renewed as a running one is.
	room chan struct{}
	// finishes carries handlers' outcomes to the one goroutine that records them in batches.
	finishes chan *finishReq
	// While taking says the reader takes messages in script calls (messages are waiting, on a
	// standalone Redis), finished runs are deferred to its next call; deferredReady wakes it
	// for them when it waits for room.
	deferMu       sync.Mutex
	taking        bool
	deferred      []*finishReq
	deferredReady chan struct{}

	// held holds the messages this consumer has taken and not done with: the renewer keeps
	// their leases. The consumer's own reclaimer can claim a message again that it still holds
	// (one whose renewals failed for a lease); ownership checks cannot tell the two copies
	// apart, so the second one is dropped here, before it is begun.
	mu   sync.Mutex
	held map[entryRef]*holding

	logMu      sync.Mutex
	lastLogged map[string]time.Time
}

// NewConsumer returns a consumer of the queue's keys. It starts nothing: Start runs it.
func (q *Queue) NewConsumer(h Handler, opts ConsumerOptions) (*Consumer, error) {
	if err := opts.applyDefaults(); err != nil {
		return nil, err
	}
	m, err := newConsumerMetrics(q, opts.Registerer)
	if err != nil {
		return nil, err
	}
	c := &Consumer{q: q, h: h, opts: opts, metrics: m, held: map[entryRef]*holding{}, lastLogged: map[string]time.Time{}}
	if opts.TracerProvider != nil {
		c.tracer = opts.TracerProvider.Tracer("github.com/computeql/computeql/queue")
	}
	return c, nil
}

// Name returns the consumer's name in the group.
func (c *Consumer) Name() string { return c.opts.Name }

// message is a delivered stream entry.
type message struct {
	shard int
	id    string
	key   string
	// fields are all the entry's fields: the key's and any trace context.
	fields map[string]any
	// reclaimed says the message was taken over from another consumer (or this one) rather
	// than read new.
	reclaimed bool
}

// entryRef identifies a stream entry.
type entryRef struct {
	shard int
	id    string
}

func (m message) ref() entryRef { return entryRef{m.shard, m.id} }

// job is a begun message on its way to a handler: the begin script's verdict, or Redis's
// error.
type job struct {
	m       message
	outcome string // "ok", "lost" or "dead"
	task    Task
	// earlier counts the key's failed deliveries before this message: when 0, success has no
	// record of failures to reset.
	earlier int64
	reason  string // why a "dead" key was dead-lettered
	err     error
	begun   time.Time
}

// maxBatch bounds how many messages one read takes and one script call begins or finishes,
// whatever the concurrency, to keep each script call short.
const maxBatch = 256

// Start runs the consumer until ctx ends, then shuts down and returns; no goroutine it
// started outlives it. Setup must have been called (by any process) before.
//
// Shutdown order: readers, the reclaimer, the forwarder and the janitor stop first, so no new
// work is taken; messages taken but not yet begun are handed back to their streams for other
// consumers (handBack; should that fail, they stay pending until reclaimed). In-flight
// handlers then get ShutdownTimeout to finish and record their outcome; after it their
// contexts are cancelled and their messages, too, stay pending.
func (c *Consumer) Start(ctx context.Context) error {
	handlerCtx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()

	c.room = make(chan struct{}, max(2*c.opts.Concurrency, c.q.opts.Shards))
	for range cap(c.room) {
		c.room <- struct{}{}
	}
	// Never more jobs are out than tokens, so sending one never waits.
	work := make(chan job, cap(c.room))
	c.finishes = make(chan *finishReq, c.opts.Concurrency)
	c.deferredReady = make(chan struct{}, 1)
	var finisher sync.WaitGroup
	finisher.Go(c.recordFinishes)
	renewing, stopRenewing := context.WithCancel(context.WithoutCancel(ctx))
	var renewer sync.WaitGroup
	renewer.Go(func() { c.renewEvery(renewing) })

	var takers sync.WaitGroup
	for _, shards := range c.readGroups() {
		takers.Go(func() { c.read(ctx, shards, work) })
	}
	takers.Go(func() { c.every(ctx, c.opts.Lease/4, c.reclaim(work)) })
	takers.Go(func() { c.every(ctx, c.opts.PollInterval, c.forward) })
	takers.Go(func() { c.every(ctx, c.opts.DeadConsumerAfter/10, c.prune) })

	var handlers sync.WaitGroup
	for range c.opts.Concurrency {
		handlers.Go(func() {
			for j := range work {
				c.process(handlerCtx, j)
				c.room <- struct{}{}
			}
		})
	}

	<-ctx.Done()
	takers.Wait()
	close(work)
	done := make(chan struct{})
	go func() { handlers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(c.opts.ShutdownTimeout):
		cancelHandlers()
		<-done
	}
	close(c.finishes)
	finisher.Wait()
	stopRenewing()
	renewer.Wait()
	return nil
}

// every runs f now and then every d until ctx ends.
func (c *Consumer) every(ctx context.Context, d time.Duration, f func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		f(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// roomFor waits until the consumer may take a message and tells how many it may, up to
// maxBatch; 0 when ctx ended first. It takes no token: another taker may take them meanwhile
// (reserve waits).
func (c *Consumer) roomFor(ctx context.Context) int {
	if ctx.Err() != nil {
		return 0 // a select would take room as readily as it sees the end
	}
	select {
	case <-c.room:
	case <-ctx.Done():
		return 0
	}
	n := 1 + len(c.room)
	c.room <- struct{}{}
	return min(n, maxBatch)
}

// reserveOrFinish takes room as reserve does, unless runs wait to be finished (or come to
// wait meanwhile): then it takes only the room there is, perhaps none. It returns -1 when ctx
// ended first.
func (c *Consumer) reserveOrFinish(ctx context.Context, n int, finish bool) int {
	if ctx.Err() != nil {
		return -1
	}
	if finish {
		return c.moreRoom(n)
	}
	select {
	case <-c.room:
		return 1 + c.moreRoom(n-1)
	case <-c.deferredReady:
		return c.moreRoom(n)
	case <-ctx.Done():
		return -1
	}
}

// reserve takes a token for each message it can, at least one (waiting for it), and returns
// how many it took; 0 when ctx ended first.
func (c *Consumer) reserve(ctx context.Context, n int) int {
	if ctx.Err() != nil {
		return 0
	}
	select {
	case <-c.room:
		return 1 + c.moreRoom(n-1)
	case <-ctx.Done():
		return 0
	}
}

// moreRoom takes up to n tokens that are free now, and returns how many.
func (c *Consumer) moreRoom(n int) int {
	for took := 0; took < n; took++ {
		select {
		case <-c.room:
		default:
			return took
		}
	}
	return n
}

// readGroups splits the shards into sets that one blocking read can wait on. Each waiting read
// holds a connection, so waiting on every shard at once matters: a standalone Redis does not
// enforce hash slots and takes all shards in one read; Redis Cluster refuses a command whose
// keys span slots, so there each shard gets its own read.
func (c *Consumer) readGroups() [][]int {
	all := make([]int, c.q.opts.Shards)
	for i := range all {
		all[i] = i
	}
	if !c.q.cluster() {
		return [][]int{all}
	}
	groups := make([][]int, len(all))
	for i, shard := range all {
		groups[i] = []int{shard}
	}
	return groups
}

// read takes new messages of the shards, as many at a time as there is room for, and begins
// them. While messages are waiting (the last take got all it asked for) one script call reads
// and begins them, and finishes the runs that ended meanwhile; otherwise a blocking read waits
// for the next, and a begin follows.
func (c *Consumer) read(ctx context.Context, shards []int, work chan<- job) {
	args := &redis.XReadGroupArgs{Group: c.q.opts.Group, Consumer: c.opts.Name, Block: c.opts.Block}
	shardOf := map[string]int{}
	for _, shard := range shards {
		args.Streams = append(args.Streams, streamKey(shard))
		shardOf[streamKey(shard)] = shard
	}
	for range shards {
		args.Streams = append(args.Streams, ">")
	}
	takes := newTakeSet(c.q, shards)
	// Only a standalone Redis's one reader reads every shard, and so can finish any run.
	finishing := !c.q.cluster()
	defer c.stopTaking()
	waiting := false
	for first := 0; ; first = (first + 1) % len(shards) {
		if waiting {
			var fin []*finishReq
			if finishing {
				fin = c.startTaking()
			}
			n := c.reserveOrFinish(ctx, maxBatch, len(fin) > 0)
			if n < 0 {
				return
			}
			if finishing {
				fin = append(fin, c.startTaking()...)
			}
			jobs, err := c.take(ctx, takes, first, n, fin)
			for range n - len(jobs) {
				c.room <- struct{}{}
			}
			if err != nil {
				c.logError(ctx, "take", err)
			}
			for _, j := range jobs {
				work <- j
			}
			waiting = err == nil && keepTaking(len(jobs), n, len(shards))
			if !waiting {
				c.stopTaking()
			}
			continue
		}
		args.Count = int64(c.roomFor(ctx))
		if args.Count == 0 {
			return
		}
		streams, err := c.q.rdb.XReadGroup(ctx, args).Result()
		if err != nil {
			if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
				c.logError(ctx, "read", err)
				c.sleep(ctx, c.opts.PollInterval)
			}
			continue
		}
		var read []message
		for _, s := range streams {
			for _, xm := range s.Messages {
				read = append(read, toMessage(shardOf[s.Stream], xm, false))
			}
		}
		c.start(ctx, read, work)
		waiting = keepTaking(len(read), int(args.Count), len(shards))
	}
}

// keepTaking tells whether the reader's next read should be a take: the last one got all it
// asked for, so more are likely waiting, and asked for at least one message a shard, so that
// the take's first XREADGROUP reads every shard. Asked for fewer, a take reads a few shards at
// a time, several XREADGROUPs in one call, where a blocking read reads every shard in one: at
// 4 handlers, 0.4 XREADGROUPs per key against 0.13.
func keepTaking(got, asked, shards int) bool {
	return got >= asked && asked >= shards
}

// take finishes the runs and then reads up to n new messages of the shards and begins them,
// in one script call, starting with shards[first]; the runs are ended with their replies.
// Like begin it is not cut short by ctx.
func (c *Consumer) take(ctx context.Context, ts *takeSet, first, n int, fin []*finishReq) ([]job, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalWriteTimeout)
	defer cancel()
	byPlace := make([][]*finishReq, len(ts.shards))
	for _, r := range fin {
		p := ts.place[r.j.m.shard]
		byPlace[p] = append(byPlace[p], r)
	}
	args := []any{c.q.opts.Group, c.opts.Name, c.q.opts.MaxDeliveries, c.q.opts.Now().UnixMilli(), c.q.opts.DeadLetterMaxLen, n, first}
	order := make([]*finishReq, 0, len(fin))
	for _, rs := range byPlace {
		args = append(args, len(rs))
		for _, r := range rs {
			args = append(args, r.finishArgs()...)
			order = append(order, r)
		}
	}
	begun := time.Now()
	jobs, finished, err := c.parseTake(takeScript.Run(ctx, c.q.rdb, ts.keys, args...), ts.shards, begun)
	if err == nil && len(finished) != len(order) {
		err = fmt.Errorf("take: %d replies for %d runs", len(finished), len(order))
	}
	for i, r := range order {
		if err != nil {
			c.recorded(r, "", err)
		} else {
			c.recorded(r, finished[i], nil)
		}
	}
	if err != nil {
		return nil, err
	}
	for _, j := range jobs {
		c.hold(j.m) // a new message: never held already
	}
	return jobs, nil
}

// takeSet is what every take call of one reader passes the same: its shards, in order, each
// shard's place among them, and their KEYS.
type takeSet struct {
	shards []int
	place  map[int]int
	keys   []string
}

func newTakeSet(q *Queue, shards []int) *takeSet {
	ts := &takeSet{shards: shards, place: make(map[int]int, len(shards)), keys: make([]string, 0, 7*len(shards))}
	for i, shard := range shards {
		ts.place[shard] = i
		ts.keys = append(ts.keys, q.keys[shard].take...)
	}
	return ts
}

// parseTake reads the take script's reply: the messages taken, and the verdicts of the runs
// finished.
func (c *Consumer) parseTake(cmd *redis.Cmd, shards []int, begun time.Time) ([]job, []string, error) {
	res, err := cmd.Slice()
	if err != nil {
		return nil, nil, err
	}
	if len(res) != 2 {
		return nil, nil, fmt.Errorf("take: unexpected reply %v", res)
	}
	verdicts, _ := res[0].([]any)
	finished := make([]string, len(verdicts))
	for i, v := range verdicts {
		finished[i], _ = v.(string)
	}
	taken, _ := res[1].([]any)
	jobs := make([]job, 0, len(taken))
	for _, r := range taken {
		e, _ := r.([]any)
		if len(e) != 4 {
			return nil, nil, fmt.Errorf("take: unexpected reply %v", r)
		}
		place, _ := e[0].(int64)
		id, _ := e[1].(string)
		flat, _ := e[2].([]any)
		if place < 0 || int(place) >= len(shards) {
			return nil, nil, fmt.Errorf("take: unexpected reply %v", r)
		}
		fields := make(map[string]any, len(flat)/2)
		for i := 0; i+1 < len(flat); i += 2 {
			if f, ok := flat[i].(string); ok {
				fields[f] = flat[i+1]
			}
		}
		key, _ := fields[keyField].(string)
		j := job{m: message{shard: shards[place], id: id, key: key, fields: fields}, begun: begun}
		j.parse(e[3])
		jobs = append(jobs, j)
	}
	return jobs, finished, nil
}

// startTaking marks the reader as taking: finished runs wait for its next take call, which
// finishes them too, rather than cost a round trip of their own. It returns those waiting.
func (c *Consumer) startTaking() []*finishReq {
	c.deferMu.Lock()
	defer c.deferMu.Unlock()
	c.taking = true
	fin := c.deferred
	c.deferred = nil
	return fin
}

// stopTaking ends taking, finishing the runs that waited for it.
func (c *Consumer) stopTaking() {
	c.deferMu.Lock()
	c.taking = false
	fin := c.deferred
	c.deferred = nil
	c.deferMu.Unlock()
	if len(fin) > 0 {
		c.finishBatch(fin)
	}
}

// deferToTaker leaves the runs to the reader's next take call while it takes, and reports
// whether it did.
func (c *Consumer) deferToTaker(reqs []*finishReq) bool {
	c.deferMu.Lock()
	defer c.deferMu.Unlock()
	if !c.taking {
		return false
	}
	c.deferred = append(c.deferred, reqs...)
	select {
	case c.deferredReady <- struct{}{}:
	default:
	}
	return true
}

func toMessage(shard int, xm redis.XMessage, reclaimed bool) message {
	key, _ := xm.Values[keyField].(string)
	return message{shard: shard, id: xm.ID, key: key, fields: xm.Values, reclaimed: reclaimed}
}

// start begins taken messages, a batch per round of room (one round, unless another taker
// took room meanwhile), and hands them to the handlers. Messages this consumer
// handles already are dropped; once ctx ends, those not begun are handed back.
func (c *Consumer) start(ctx context.Context, msgs []message, work chan<- job) {
	msgs = slices.DeleteFunc(msgs, func(m message) bool { return !c.hold(m) })
	for len(msgs) > 0 {
		n := 0
		if ctx.Err() == nil {
			n = c.reserve(ctx, len(msgs))
		}
		if n == 0 {
			for _, m := range msgs {
				c.release(m)
			}
			c.handBack(msgs)
			return
		}
		for _, j := range c.begin(ctx, msgs[:n]) {
			work <- j
		}
		msgs = msgs[n:]
	}
}

// reclaim takes over messages whose consumer stopped renewing them for longer than the lease.
func (c *Consumer) reclaim(work chan<- job) func(context.Context) {
	return func(ctx context.Context) {
		for shard := range c.q.opts.Shards {
			n := c.roomFor(ctx)
			if n == 0 {
				return
			}
			msgs, _, err := c.q.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
				Stream: streamKey(shard), Group: c.q.opts.Group, Consumer: c.opts.Name,
				MinIdle: c.opts.Lease, Start: "0-0", Count: int64(n),
			}).Result()
			if err != nil {
				if ctx.Err() == nil {
					c.logError(ctx, "reclaim", err)
				}
				return
			}
			taken := make([]message, len(msgs))
			for i, xm := range msgs {
				c.metrics.reclaimed.Inc()
				taken[i] = toMessage(shard, xm, true)
			}
			c.start(ctx, taken, work)
		}
	}
}

// begin runs the begin script for the messages (one call; one per shard, pipelined, on a
// cluster) and returns a job for each. It is not cut short by ctx: a batch begun is handled.
func (c *Consumer) begin(ctx context.Context, msgs []message) []job {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalWriteTimeout)
	defer cancel()
	now, begun := c.q.opts.Now(), time.Now()
	jobs := make([]job, 0, len(msgs))
	calls := batch(c.q, msgs, func(m message) int { return m.shard },
		func() []any {
			return []any{c.q.opts.Group, c.opts.Name, c.q.opts.MaxDeliveries, now.UnixMilli(), c.q.opts.DeadLetterMaxLen}
		},
		func(shard int) []string { return c.q.keys[shard].begin },
		func(args []any, m message) []any {
			mode := "n"
			if m.reclaimed {
				mode = "r"
			}
			jobs = append(jobs, job{m: m, begun: begun})
			return append(args, m.id, m.key, mode)
		})
	c.q.runCalls(ctx, beginScript, calls)
	next := 0
	for _, call := range calls {
		batch := jobs[next : next+call.n]
		next += call.n
		res, err := call.cmd.Slice()
		if err == nil && len(res) != len(batch) {
			err = fmt.Errorf("begin: %d replies for %d messages", len(res), len(batch))
		}
		for i := range batch {
			if err != nil {
				batch[i].err = err
				continue
			}
			batch[i].parse(res[i])
		}
	}
	return jobs
}

// parse reads the begin script's reply for the job's message.
func (j *job) parse(reply any) {
	r, _ := reply.([]any)
	if len(r) == 0 {
		j.err = fmt.Errorf("begin: unexpected reply %v", reply)
		return
	}
	j.outcome, _ = r[0].(string)
	switch {
	case j.outcome == "ok" && len(r) == 4:
		fence, _ := r[1].(int64)
		attempt, _ := r[2].(int64)
		j.earlier, _ = r[3].(int64)
		j.task = Task{Key: j.m.key, Fence: fence, Attempt: int(attempt)}
	case j.outcome == "dead" && len(r) == 3:
		j.reason, _ = r[1].(string)
	case j.outcome != "lost":
		j.err = fmt.Errorf("begin: unexpected reply %v", reply)
	}
}

// handBack returns messages taken but not begun when the consumer stops, so that a stopping
// worker does not strand them for a lease. It runs after ctx ended, so with a context of its
// own; if it fails, the messages are reclaimed after the lease as before.
func (c *Consumer) handBack(msgs []message) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	byShard := map[int][]any{}
	for _, m := range msgs {
		byShard[m.shard] = append(byShard[m.shard], m.id, m.key)
	}
	for shard, idKeys := range byShard {
		args := append([]any{c.q.opts.Group, c.opts.Name}, idKeys...)
		if err := handBackScript.Run(ctx, c.q.rdb, []string{streamKey(shard), stateKey(shard)}, args...).Err(); err != nil {
			c.logError(ctx, "hand back", err)
		}
	}
}

// forward moves due delayed keys of every shard onto their streams in one round trip.
func (c *Consumer) forward(ctx context.Context) {
	now := c.q.opts.Now().UnixMilli()
	run := func() error {
		_, err := c.q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for shard := range c.q.opts.Shards {
				forwardScript.Run(ctx, p, []string{streamKey(shard), stateKey(shard), delayedKey(shard)}, now, 1000)
			}
			return nil
		})
		return err
	}
	err := run()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		// In a pipeline Script.Run cannot fall back to EVAL, so a script cache Redis lost (a
		// restart, a failover) would stop every delayed key for good: load it again.
		if err = forwardScript.Load(ctx, c.q.rdb).Err(); err == nil {
			err = run()
		}
	}
	if err != nil && ctx.Err() == nil {
		c.logError(ctx, "forward delayed keys", err)
	}
}

// prune removes consumers that left without holding messages.
func (c *Consumer) prune(ctx context.Context) {
	for shard := range c.q.opts.Shards {
		err := pruneConsumersScript.Run(ctx, c.q.rdb, []string{streamKey(shard)},
			c.q.opts.Group, c.opts.DeadConsumerAfter.Milliseconds(), c.opts.Name).Err()
		if err != nil && ctx.Err() == nil {
			c.logError(ctx, "prune consumers", err)
			return
		}
	}
}

// finalWriteTimeout bounds the writes that begin taken messages and record a handler's
// outcome; they run even when the consumer is shutting down, because skipping them would
// only make another consumer redo the work.
const finalWriteTimeout = 5 * time.Second

// process runs one begun message in the trace it carries. Its handler's slot is free again
// once the handler returned: the outcome is recorded after, with others, by the finisher.
func (c *Consumer) process(ctx context.Context, j job) {
	if ctx.Err() != nil {
		c.release(j.m)
		return // shut down past the timeout: leave it pending
	}
	ctx = c.joinTrace(ctx, j.m)
	end := func(runResult) { c.release(j.m) }
	if c.tracer != nil {
		ctx, end = c.traceRun(ctx, j)
	}
	c.run(ctx, j, end)
}

// runResult is how a run ended: outcome is a computeql_queue_handled_total outcome, or
// "error" (Redis failed; the message stays pending) or "abandoned" (shutdown cut the handler
// off; pending too). err is the handler's error, or Redis's.
type runResult struct {
	task    Task
	outcome string
	err     error
}

// run handles one begun message: handle while renewing the lease, then finish. end is called
// once with the result, when the outcome is recorded.
func (c *Consumer) run(ctx context.Context, j job, end func(runResult)) {
	m := j.m
	if j.err != nil {
		c.logError(ctx, "begin", j.err, "key", m.key)
		end(runResult{outcome: "error", err: j.err}) // pending: retried once reclaimed
		return
	}
	switch j.outcome {
	case "lost":
		c.metrics.handled.WithLabelValues("lost").Inc()
		end(runResult{outcome: "lost"})
		return
	case "dead":
		c.buried(ctx, m.key, j.reason)
		end(runResult{outcome: "dead"})
		return
	}
	task := j.task

	taskCtx, cancelTask := context.WithCancel(ctx)
	h, ok := c.running(m, cancelTask)
	if !ok {
		cancelTask()
		c.metrics.handled.WithLabelValues("lost").Inc()
		end(runResult{task: task, outcome: "lost"})
		return
	}
	c.metrics.inflight.Inc()
	start := time.Now()
	again, herr := c.call(taskCtx, task)
	c.metrics.latency.Observe(time.Since(start).Seconds())
	c.metrics.inflight.Dec()
	cancelTask()
	select {
	case <-h.lost:
		c.metrics.handled.WithLabelValues("lost").Inc()
		end(runResult{task: task, outcome: "lost", err: herr})
		return
	default:
	}
	if ctx.Err() != nil {
		// Cancelled by shutdown: the result is not trusted; leave it pending.
		end(runResult{task: task, outcome: "abandoned", err: herr})
		return
	}
	c.finish(ctx, j, again, herr, end)
}

// holding is a message the consumer holds: taken, and not yet done with.
type holding struct {
	// lost is closed when a renewal finds another consumer owns the message now.
	lost chan struct{}
	// cancel ends its handler's context once the handler runs.
	cancel context.CancelFunc
}

// hold marks the message as held here; it reports false if it already was.
func (c *Consumer) hold(m message) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.held[m.ref()]; dup {
		return false
	}
	c.held[m.ref()] = &holding{lost: make(chan struct{})}
	return true
}

// running records that the held message's handler runs with the cancel func, and returns its
// holding; false when the message was lost while it waited for a handler, which then must
// not run.
func (c *Consumer) running(m message, cancel context.CancelFunc) (*holding, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.held[m.ref()]
	select {
	case <-h.lost:
		return h, false
	default:
	}
	h.cancel = cancel
	return h, true
}

func (c *Consumer) release(m message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.held, m.ref())
}

// call runs the handler, turning a panic into an error so that one bad key cannot take the
// consumer down.
func (c *Consumer) call(ctx context.Context, t Task) (again time.Duration, err error) {
	defer func() {
		if p := recover(); p != nil {
			c.metrics.panics.Inc()
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return c.h.Handle(ctx, t)
}

// renewEvery renews the leases of every held message each Lease/3, until ctx ends: it runs
// until the handlers have stopped, since they may outlast the consumer's context.
func (c *Consumer) renewEvery(ctx context.Context) {
	t := time.NewTicker(c.opts.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.renew(ctx)
	}
}

// renew extends the lease of every held message in one round trip, and tells the handlers of
// those another consumer took over that they are lost: their contexts end.
func (c *Consumer) renew(ctx context.Context) {
	c.mu.Lock()
	refs := make([]entryRef, 0, len(c.held))
	for ref := range c.held {
		refs = append(refs, ref)
	}
	c.mu.Unlock()
	if len(refs) == 0 {
		return
	}
	var order []entryRef
	calls := batch(c.q, refs, func(r entryRef) int { return r.shard },
		func() []any { return []any{c.q.opts.Group, c.opts.Name} },
		func(shard int) []string { return []string{streamKey(shard)} },
		func(args []any, r entryRef) []any {
			order = append(order, r)
			return append(args, r.id)
		})
	c.q.runCalls(ctx, renewScript, calls)
	for _, call := range calls {
		refs := order[:call.n]
		order = order[call.n:]
		owned, err := call.cmd.Int64Slice()
		if err == nil && len(owned) != len(refs) {
			err = fmt.Errorf("renew: %d replies for %d messages", len(owned), len(refs))
		}
		if err != nil {
			if ctx.Err() == nil {
				c.logError(ctx, "renew lease", err)
			}
			continue // a transient failure; the lease lasts three renewal periods
		}
		c.mu.Lock()
		for i, ref := range refs {
			h := c.held[ref]
			if owned[i] == 1 || h == nil {
				continue
			}
			select {
			case <-h.lost:
			default:
				close(h.lost)
				if h.cancel != nil {
					h.cancel()
				}
			}
		}
		c.mu.Unlock()
	}
}

// finishReq is a handler's outcome waiting to be recorded.
type finishReq struct {
	ctx     context.Context
	j       *job
	outcome string // "ok", "requeued" or "retried"
	herr    error
	status  string // "ok" or "failed"
	errText string
	at      int64 // when to run again, Unix ms; 0 for not at all
	end     func(runResult)
}

// finish records the handler's outcome and then calls end: a terminal error's burial at once,
// any other outcome through the finisher.
func (c *Consumer) finish(ctx context.Context, j job, again time.Duration, herr error, end func(runResult)) {
	m, t := j.m, j.task
	now := c.q.opts.Now()
	var term terminalError
	if errors.As(herr, &term) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalWriteTimeout)
		defer cancel()
		res, err := buryScript.Run(ctx, c.q.rdb, buryShardKeys(m.shard),
			c.q.opts.Group, m.id, m.key, t.Fence, herr.Error(), t.Attempt, now.UnixMilli(), c.q.opts.DeadLetterMaxLen).Text()
		switch {
		case err != nil:
			c.logError(ctx, "dead-letter", err, "key", m.key)
			end(runResult{task: t, outcome: "error", err: err})
		case res == "ok":
			c.buried(ctx, m.key, herr.Error())
			end(runResult{task: t, outcome: "dead", err: herr})
		default:
			c.metrics.handled.WithLabelValues("lost").Inc()
			end(runResult{task: t, outcome: "lost", err: herr})
		}
		return
	}
	req := &finishReq{ctx: ctx, j: &j, outcome: "ok", herr: herr, status: "ok", end: end}
	switch {
	case herr != nil:
		req.outcome, req.status, req.errText = "retried", "failed", herr.Error()
		req.at = now.Add(c.backoff(t.Attempt)).UnixMilli()
	case again > 0:
		req.outcome = "requeued"
		req.at = now.Add(c.jitter(again)).UnixMilli()
	}
	c.finishes <- req
}

// finishArgs are the run's eight fields in a finish or take script call.
func (r *finishReq) finishArgs() []any {
	return []any{r.j.m.id, r.j.m.key, r.j.task.Fence, r.status, r.j.earlier, r.j.task.Attempt, r.errText, r.at}
}

// recorded ends a run whose finish Redis answered: res is the script's reply for it, err
// Redis's error.
func (c *Consumer) recorded(r *finishReq, res string, err error) {
	out := runResult{task: r.j.task, outcome: r.outcome, err: r.herr}
	switch {
	case err != nil:
		c.logError(r.ctx, "finish", err, "key", r.j.m.key)
		out.outcome, out.err = "error", err
	case res == "lost":
		c.metrics.handled.WithLabelValues("lost").Inc()
		out.outcome = "lost"
	default:
		c.metrics.handled.WithLabelValues(r.outcome).Inc()
	}
	r.end(out)
}

// recordFinishes records handlers' outcomes until the channel closes: each call takes every
// outcome that arrived while the one before was under way, so that under load many runs are
// finished in one round trip, and a lone run as soon as it ends.
func (c *Consumer) recordFinishes() {
	for req := range c.finishes {
		reqs := []*finishReq{req}
	more:
		for len(reqs) < maxBatch {
			select {
			case r, ok := <-c.finishes:
				if !ok {
					break more
				}
				reqs = append(reqs, r)
			default:
				break more
			}
		}
		if !c.deferToTaker(reqs) {
			c.finishBatch(reqs)
		}
	}
}

// finishBatch runs the finish script for the runs (one call; one per shard, pipelined, on a
// cluster) and ends each.
func (c *Consumer) finishBatch(reqs []*finishReq) {
	ctx, cancel := context.WithTimeout(context.Background(), finalWriteTimeout)
	defer cancel()
	var order []*finishReq
	calls := batch(c.q, reqs, func(r *finishReq) int { return r.j.m.shard },
		func() []any { return []any{c.q.opts.Group} },
		func(shard int) []string { return c.q.keys[shard].finish },
		func(args []any, r *finishReq) []any {
			order = append(order, r)
			return append(args, r.finishArgs()...)
		})
	c.q.runCalls(ctx, finishScript, calls)
	for _, call := range calls {
		batch := order[:call.n]
		order = order[call.n:]
		res, err := call.cmd.StringSlice()
		if err == nil && len(res) != len(batch) {
			err = fmt.Errorf("finish: %d replies for %d runs", len(res), len(batch))
		}
		for i, r := range batch {
			if err != nil {
				c.recorded(r, "", err)
			} else {
				c.recorded(r, res[i], nil)
			}
		}
	}
}

func (c *Consumer) buried(ctx context.Context, key, reason string) {
	c.metrics.handled.WithLabelValues("dead").Inc()
	c.opts.Logger.WarnContext(ctx, "key dead-lettered", "key", key, "reason", reason)
	if c.opts.OnDeadLetter != nil {
		c.opts.OnDeadLetter(ctx, key, reason)
	}
}

// backoff is BackoffBase doubled for every failure after the first, capped, with jitter.
func (c *Consumer) backoff(attempt int) time.Duration {
	d := float64(c.opts.BackoffBase) * math.Pow(2, float64(max(attempt-1, 0)))
	return c.jitter(time.Duration(min(d, float64(c.opts.BackoffMax))))
}

func (c *Consumer) jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (1 + c.opts.Jitter*(2*mrand.Float64()-1)))
}

func (c *Consumer) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// logInterval is the least time between two log lines of one failing operation: while Redis
// is unreachable every loop fails many times a second, and one line says it.
const logInterval = 5 * time.Second

// logError counts failures of the consumer's own loops, which retry by themselves, and logs
// them at most once per logInterval per operation. op is a fixed name, the key (if any) an
// attribute: a name per key would log every key's failure and keep a map entry for each.
func (c *Consumer) logError(ctx context.Context, op string, err error, attrs ...any) {
	c.metrics.errors.Inc()
	c.logMu.Lock()
	now := time.Now()
	quiet := now.Sub(c.lastLogged[op]) < logInterval
	if !quiet {
		c.lastLogged[op] = now
	}
	c.logMu.Unlock()
	if !quiet {
		c.opts.Logger.ErrorContext(ctx, "queue: "+op, append([]any{"consumer", c.opts.Name, "err", err}, attrs...)...)
	}
}
