package queue

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"
)

// waitLimit is the generous deadline every wait of this package's tests uses: it only bounds
// how long a broken test hangs, it never decides whether a timing is right.
const waitLimit = 15 * time.Second

// newTestQueue returns a client of a flushed database and a set-up queue on it.
func newTestQueue(t testing.TB, opts Options) (*redis.Client, *Queue) {
	t.Helper()
	rdb := redisServer.Client(t)
	q, err := New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Setup(context.Background()); err != nil {
		t.Fatal(err)
	}
	return rdb, q
}

// quietLogger keeps expected warnings (dead letters, lost leases) out of the test output while
// still showing errors of the consumer's own loops.
var quietLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// testConsumerOptions fills the small timings the tests run with into the fields left zero.
func testConsumerOptions(opts ConsumerOptions) ConsumerOptions {
	if opts.Lease == 0 {
		opts.Lease = 500 * time.Millisecond
	}
	if opts.Block == 0 {
		opts.Block = 50 * time.Millisecond
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 10 * time.Millisecond
	}
	if opts.BackoffBase == 0 {
		opts.BackoffBase = 20 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = quietLogger
	}
	return opts
}

// running is a consumer started by startConsumer.
type running struct {
	c      *Consumer
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	t      *testing.T
}

// stop cancels the consumer's context and waits for Start to return. It may be called more
// than once; the test's cleanup calls it too.
func (r *running) stop() {
	r.t.Helper()
	r.once.Do(r.cancel)
	select {
	case <-r.done:
	case <-time.After(waitLimit):
		r.t.Errorf("consumer %s: Start did not return after its context ended", r.c.Name())
	}
}

// returned reports, without waiting, whether Start has returned.
func (r *running) returned() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// startConsumer runs a consumer with test timings in a goroutine; it is stopped when the test
// ends, before the test's other cleanups (so the Redis client is still open).
func startConsumer(t *testing.T, q *Queue, h Handler, opts ConsumerOptions) *running {
	t.Helper()
	c, err := q.NewConsumer(h, testConsumerOptions(opts))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan struct{}), t: t}
	go func() {
		defer close(r.done)
		if err := c.Start(ctx); err != nil {
			t.Errorf("consumer %s: Start: %v", c.Name(), err)
		}
	}()
	t.Cleanup(r.stop)
	return r
}

// waitFor waits for ch to be closed or to yield a value, failing the test after waitLimit.
func waitFor[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLimit):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// idle waits until none of the keys waits or is being handled.
func waitIdle(t *testing.T, q *Queue, keys ...string) {
	t.Helper()
	ctx := context.Background()
	eventually.Holds(t, waitLimit, func() bool {
		for _, k := range keys {
			w, err := q.Waiting(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if w {
				return false
			}
		}
		return true
	}, "keys %v still waiting", keys)
}

// runLog counts handler runs per key, safe for concurrent handlers.
type runLog struct {
	mu    sync.Mutex
	runs  map[string][]Task
	start map[string][]time.Time
	end   map[string][]time.Time
}

func newRunLog() *runLog {
	return &runLog{runs: map[string][]Task{}, start: map[string][]time.Time{}, end: map[string][]time.Time{}}
}

func (l *runLog) begin(t Task) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs[t.Key] = append(l.runs[t.Key], t)
	l.start[t.Key] = append(l.start[t.Key], time.Now())
}

func (l *runLog) finish(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.end[key] = append(l.end[key], time.Now())
}

func (l *runLog) count(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.runs[key])
}

func (l *runLog) tasks(key string) []Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Task(nil), l.runs[key]...)
}

func (l *runLog) times(key string) (start, end []time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Time(nil), l.start[key]...), append([]time.Time(nil), l.end[key]...)
}

// pendingCount is XPENDING's count for a shard's stream.
func pendingCount(t *testing.T, rdb *redis.Client, q *Queue, shard int) int64 {
	t.Helper()
	p, err := rdb.XPending(context.Background(), streamKey(shard), q.opts.Group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// totalLen sums XLEN over every shard's work stream.
func totalLen(t *testing.T, rdb *redis.Client, q *Queue) int64 {
	t.Helper()
	var n int64
	for shard := range q.opts.Shards {
		n += rdb.XLen(context.Background(), streamKey(shard)).Val()
	}
	return n
}

// totalPending sums XPENDING's count over every shard.
func totalPending(t *testing.T, rdb *redis.Client, q *Queue) int64 {
	t.Helper()
	var n int64
	for shard := range q.opts.Shards {
		n += pendingCount(t, rdb, q, shard)
	}
	return n
}

// counterValue reads a counter (or a gauge) the consumer keeps.
func counterValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	t.Fatalf("metric %v is neither a counter nor a gauge", c.Desc())
	return 0
}

// handledCount is the consumer's computeql_queue_handled_total for one outcome.
func handledCount(t *testing.T, c *Consumer, outcome string) float64 {
	t.Helper()
	return counterValue(t, c.metrics.handled.WithLabelValues(outcome))
}

// goroutineDump helps explain a failed leak check.
func goroutineDump() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// keysOnShard returns n distinct keys that map to the shard.
func keysOnShard(q *Queue, shard, n int, prefix string) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		k := fmt.Sprintf("%s%d", prefix, i)
		if q.Shard(k) == shard {
			out = append(out, k)
		}
	}
	return out
}

// blockedReaders counts the connections of the named client blocked in XREADGROUP.
func blockedReaders(t *testing.T, rdb *redis.Client, clientName string) int {
	t.Helper()
	list, err := rdb.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		f := " " + line + " "
		if strings.Contains(f, " name="+clientName+" ") && strings.Contains(f, " cmd=xreadgroup ") && strings.Contains(f, " flags=b ") {
			n++
		}
	}
	return n
}

// anotherProcess returns a queue with its own Redis client (and so its own connection pool),
// named clientName, on the test's database, as another worker process would have. A consumer holds one
// connection per shard blocked in XREADGROUP, so consumers sharing one client's pool would
// starve each other's begin, renew and finish calls.
func anotherProcess(t *testing.T, opts Options, clientName string) *Queue {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisServer.Addr, ClientName: clientName})
	t.Cleanup(func() { rdb.Close() })
	q, err := New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// enqueueConcurrently adds key n times from each of producers goroutines at once.
func enqueueConcurrently(t *testing.T, q *Queue, key string, producers, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for range producers {
		wg.Go(func() {
			for range n {
				if err := q.Enqueue(context.Background(), key); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
