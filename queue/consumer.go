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
	// Fence increases with every delivery of any key of the shard. A handler passes it on to
	// its writes so that a stale run (one whose lease was lost) can be refused by them.
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

	// processing holds the messages this consumer's handlers have taken. The consumer's own
	// reclaimer can claim a message again that it still holds (one read while every handler
	// was busy, or whose renewals failed for a lease); ownership checks cannot tell the two
	// copies apart, so the second one is dropped here.
	mu         sync.Mutex
	processing map[entryRef]struct{}

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
	c := &Consumer{q: q, h: h, opts: opts, metrics: m, processing: map[entryRef]struct{}{}, lastLogged: map[string]time.Time{}}
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
}

// entryRef identifies a stream entry.
type entryRef struct {
	shard int
	id    string
}

func (m message) ref() entryRef { return entryRef{m.shard, m.id} }

// Start runs the consumer until ctx ends, then shuts down and returns; no goroutine it
// started outlives it. Setup must have been called (by any process) before.
//
// Shutdown order: readers, the reclaimer, the forwarder and the janitor stop first, so no new
// work is taken; messages read but not yet begun are handed back to their streams for other
// consumers (handBack; should that fail, they stay pending until reclaimed). In-flight
// handlers then get ShutdownTimeout to finish and record their outcome; after it their
// contexts are cancelled and their messages, too, stay pending.
func (c *Consumer) Start(ctx context.Context) error {
	handlerCtx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()

	work := make(chan message)
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
			for m := range work {
				c.process(handlerCtx, m)
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

// deliver hands a message to a free handler; it gives up when ctx ends, leaving the message
// pending for whoever reclaims it.
func deliver(ctx context.Context, work chan<- message, m message) bool {
	select {
	case work <- m:
		return true
	case <-ctx.Done():
		return false
	}
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
	if _, cluster := c.q.rdb.(*redis.ClusterClient); !cluster {
		return [][]int{all}
	}
	groups := make([][]int, len(all))
	for i, shard := range all {
		groups[i] = []int{shard}
	}
	return groups
}

// read takes new messages of the shards, as many at a time as there are handlers.
func (c *Consumer) read(ctx context.Context, shards []int, work chan<- message) {
	args := &redis.XReadGroupArgs{Group: c.q.opts.Group, Consumer: c.opts.Name, Count: int64(c.opts.Concurrency), Block: c.opts.Block}
	shardOf := map[string]int{}
	for _, shard := range shards {
		args.Streams = append(args.Streams, streamKey(shard))
		shardOf[streamKey(shard)] = shard
	}
	for range shards {
		args.Streams = append(args.Streams, ">")
	}
	for ctx.Err() == nil {
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
				read = append(read, toMessage(shardOf[s.Stream], xm))
			}
		}
		for i, m := range read {
			if !deliver(ctx, work, m) {
				c.handBack(read[i:])
				return
			}
		}
	}
}

func toMessage(shard int, xm redis.XMessage) message {
	key, _ := xm.Values[keyField].(string)
	return message{shard: shard, id: xm.ID, key: key, fields: xm.Values}
}

// reclaim takes over messages whose consumer stopped renewing them for longer than the lease.
func (c *Consumer) reclaim(work chan<- message) func(context.Context) {
	return func(ctx context.Context) {
		for shard := range c.q.opts.Shards {
			msgs, _, err := c.q.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
				Stream: streamKey(shard), Group: c.q.opts.Group, Consumer: c.opts.Name,
				MinIdle: c.opts.Lease, Start: "0-0", Count: int64(c.opts.Concurrency),
			}).Result()
			if err != nil {
				if ctx.Err() == nil {
					c.logError(ctx, "reclaim", err)
				}
				return
			}
			for i, xm := range msgs {
				c.metrics.reclaimed.Inc()
				if !deliver(ctx, work, toMessage(shard, xm)) {
					left := make([]message, 0, len(msgs)-i)
					for _, xm := range msgs[i:] {
						left = append(left, toMessage(shard, xm))
					}
					c.handBack(left)
					return
				}
			}
		}
	}
}

// handBack returns messages taken but not begun when the consumer stops: a read takes up to
// Concurrency messages of every shard at once, and without this a stopping worker would
// strand them all for a lease. It runs after ctx ended, so with a context of its own; if it
// fails, the messages are reclaimed after the lease as before.
func (c *Consumer) handBack(msgs []message) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	byShard := map[int][]any{}
	for _, m := range msgs {
		byShard[m.shard] = append(byShard[m.shard], m.id)
	}
	for shard, ids := range byShard {
		args := append([]any{c.q.opts.Group, c.opts.Name}, ids...)
		if err := handBackScript.Run(ctx, c.q.rdb, []string{streamKey(shard)}, args...).Err(); err != nil {
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

func (c *Consumer) shardKeys(shard int) []string {
	return []string{streamKey(shard), stateKey(shard), attemptsKey(shard), fenceKey(shard), deadKey(shard), lastErrorKey(shard)}
}

// finalWriteTimeout bounds the writes that record a handler's outcome; they run even when the
// consumer is shutting down, because skipping them would only make another consumer redo
// finished work.
const finalWriteTimeout = 5 * time.Second

// process runs one message in the trace it carries.
func (c *Consumer) process(ctx context.Context, m message) {
	if ctx.Err() != nil {
		return // shutting down: leave it pending
	}
	if !c.take(m) {
		return // another handler of this consumer has it already
	}
	defer c.release(m)
	ctx = c.joinTrace(ctx, m)
	if c.tracer != nil {
		c.traceRun(ctx, m)
		return
	}
	c.run(ctx, m)
}

// runResult is how a run ended: outcome is a computeql_queue_handled_total outcome, or
// "error" (Redis failed; the message stays pending) or "abandoned" (shutdown cut the handler
// off; pending too). err is the handler's error, or Redis's.
type runResult struct {
	task    Task
	outcome string
	err     error
}

// run handles one message: begin, handle while renewing the lease, finish.
func (c *Consumer) run(ctx context.Context, m message) runResult {
	now := c.q.opts.Now().UnixMilli()
	res, err := beginScript.Run(ctx, c.q.rdb, c.shardKeys(m.shard),
		c.q.opts.Group, c.opts.Name, m.id, m.key, c.q.opts.MaxDeliveries, now, c.q.opts.DeadLetterMaxLen).Slice()
	if err != nil {
		c.logError(ctx, "begin", err, "key", m.key)
		return runResult{outcome: "error", err: err} // pending: retried once reclaimed
	}
	switch res[0] {
	case "lost":
		c.metrics.handled.WithLabelValues("lost").Inc()
		return runResult{outcome: "lost"}
	case "dead":
		reason, _ := res[1].(string)
		c.buried(ctx, m.key, reason)
		return runResult{outcome: "dead"}
	}
	task := Task{Key: m.key, Fence: res[1].(int64), Attempt: int(res[2].(int64))}

	taskCtx, cancelTask := context.WithCancel(ctx)
	lost := make(chan struct{})
	var renewer sync.WaitGroup
	renewer.Go(func() { c.renew(taskCtx, m, cancelTask, lost) })
	c.metrics.inflight.Inc()
	start := time.Now()
	again, herr := c.call(taskCtx, task)
	c.metrics.latency.Observe(time.Since(start).Seconds())
	c.metrics.inflight.Dec()
	cancelTask()
	renewer.Wait()
	select {
	case <-lost:
		c.metrics.handled.WithLabelValues("lost").Inc()
		return runResult{task: task, outcome: "lost", err: herr}
	default:
	}
	if ctx.Err() != nil {
		// Cancelled by shutdown: the result is not trusted; leave it pending.
		return runResult{task: task, outcome: "abandoned", err: herr}
	}
	outcome, err := c.finish(ctx, m, task, again, herr)
	if err == nil {
		err = herr
	}
	return runResult{task: task, outcome: outcome, err: err}
}

// take marks the message as being processed here; it reports false if it already was.
func (c *Consumer) take(m message) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.processing[m.ref()]; dup {
		return false
	}
	c.processing[m.ref()] = struct{}{}
	return true
}

func (c *Consumer) release(m message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.processing, m.ref())
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

// renew keeps the lease of a running handler; when it is lost, the handler is cancelled.
func (c *Consumer) renew(ctx context.Context, m message, cancel context.CancelFunc, lost chan<- struct{}) {
	t := time.NewTicker(c.opts.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ok, err := renewScript.Run(ctx, c.q.rdb, []string{streamKey(m.shard)}, c.q.opts.Group, c.opts.Name, m.id).Int()
		if err != nil {
			if ctx.Err() == nil {
				c.logError(ctx, "renew lease", err, "key", m.key)
			}
			continue // a transient failure; the lease lasts three renewal periods
		}
		if ok == 0 {
			close(lost)
			cancel()
			return
		}
	}
}

// finish records the handler's outcome, and returns it; err is Redis's.
func (c *Consumer) finish(ctx context.Context, m message, t Task, again time.Duration, herr error) (string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalWriteTimeout)
	defer cancel()
	now := c.q.opts.Now()
	var term terminalError
	if errors.As(herr, &term) {
		res, err := buryScript.Run(ctx, c.q.rdb, c.shardKeys(m.shard), c.q.opts.Group, c.opts.Name, m.id, m.key,
			herr.Error(), t.Attempt, now.UnixMilli(), c.q.opts.DeadLetterMaxLen).Text()
		switch {
		case err != nil:
			c.logError(ctx, "dead-letter", err, "key", m.key)
			return "error", err
		case res == "ok":
			c.buried(ctx, m.key, herr.Error())
			return "dead", nil
		default:
			c.metrics.handled.WithLabelValues("lost").Inc()
			return "lost", nil
		}
	}
	outcome, status, errText, at := "ok", "ok", "", int64(0)
	switch {
	case herr != nil:
		outcome, status, errText = "retried", "failed", herr.Error()
		at = now.Add(c.backoff(t.Attempt)).UnixMilli()
	case again > 0:
		outcome = "requeued"
		at = now.Add(c.jitter(again)).UnixMilli()
	}
	res, err := finishScript.Run(ctx, c.q.rdb, []string{streamKey(m.shard), stateKey(m.shard), attemptsKey(m.shard), delayedKey(m.shard), lastErrorKey(m.shard)},
		c.q.opts.Group, c.opts.Name, m.id, m.key, status, errText, at).Text()
	switch {
	case err != nil:
		c.logError(ctx, "finish", err, "key", m.key)
		return "error", err
	case res == "lost":
		c.metrics.handled.WithLabelValues("lost").Inc()
		return "lost", nil
	default:
		c.metrics.handled.WithLabelValues(outcome).Inc()
		return outcome, nil
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
