package queue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/logtest"
)

// Semantics 2: a handler that outlasts its lease renews it, so no consumer reclaims the key
// while it is still being handled.
func TestLongHandlerRenewsItsLease(t *testing.T) {
	_, q := newTestQueue(t, Options{Shards: 2})
	ctx := context.Background()
	log := newRunLog()
	handler := HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		log.begin(task)
		time.Sleep(1500 * time.Millisecond) // five leases of work
		log.finish(task.Key)
		return 0, nil
	})
	opts := ConsumerOptions{Lease: 300 * time.Millisecond}
	opts.Name = "a"
	a := startConsumer(t, q, handler, opts)
	opts.Name = "b"
	b := startConsumer(t, q, handler, opts)
	if err := q.Enqueue(ctx, "long"); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, q, "long")
	if n := log.count("long"); n != 1 {
		t.Errorf("key handled %d times, want once: %+v", n, log.tasks("long"))
	}
	for _, r := range []*running{a, b} {
		if n := counterValue(t, r.c.metrics.reclaimed); n != 0 {
			t.Errorf("consumer %s reclaimed %v messages", r.c.Name(), n)
		}
		if n := handledCount(t, r.c, "lost"); n != 0 {
			t.Errorf("consumer %s lost %v leases", r.c.Name(), n)
		}
	}
}

// exclusion fails the test if a key is ever handled by two handlers at once.
type exclusion struct {
	t       *testing.T
	mu      sync.Mutex
	running map[string]string // key → who
	clashes atomic.Int64
}

func newExclusion(t *testing.T) *exclusion {
	return &exclusion{t: t, running: map[string]string{}}
}

func (e *exclusion) enter(key, who string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if other, busy := e.running[key]; busy {
		e.clashes.Add(1)
		e.t.Errorf("%s handles %s while %s still does", who, key, other)
		return
	}
	e.running[key] = who
}

func (e *exclusion) leave(key, who string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running[key] == who {
		delete(e.running, key)
	}
}

// Semantics 3 and 4, checked: 8 consumers of one group, 50 keys each added again and again
// by several producers while handlers take 0–5ms. No key is ever handled by two handlers at
// once, and every key's last run saw the newest state (it started after the key's last add).
func TestNoKeyHandledByTwoAtOnce(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	const (
		consumers = 8
		keys      = 50
		producers = 4
		rounds    = 20
	)
	ex := newExclusion(t)
	// version is the "state" each key names: producers change it, then add the key; a handler
	// reads it when it starts. The last run of a key must have seen the last version.
	var mu sync.Mutex
	version := map[string]int{}
	seen := map[string]int{}
	var runs atomic.Int64
	var hid atomic.Int64
	for i := range consumers {
		startConsumer(t, anotherProcess(t, q.opts, fmt.Sprint("process-", i)), HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
			who := fmt.Sprintf("consumer %d run %d (fence %d)", i, hid.Add(1), task.Fence)
			ex.enter(task.Key, who)
			defer ex.leave(task.Key, who)
			mu.Lock()
			seen[task.Key] = version[task.Key]
			mu.Unlock()
			runs.Add(1)
			time.Sleep(time.Duration(rand.IntN(5001)) * time.Microsecond)
			return 0, nil
		}), ConsumerOptions{Name: fmt.Sprint("c", i), Lease: time.Second})
	}
	key := func(i int) string { return fmt.Sprint("key-", i) }
	var wg sync.WaitGroup
	var adds atomic.Int64
	for range producers {
		wg.Go(func() {
			for range rounds {
				for _, i := range rand.Perm(keys) {
					mu.Lock()
					version[key(i)]++
					mu.Unlock()
					if err := q.Enqueue(ctx, key(i)); err != nil {
						t.Error(err)
						return
					}
					adds.Add(1)
				}
			}
		})
	}
	wg.Wait()
	all := make([]string, keys)
	for i := range keys {
		all[i] = key(i)
	}
	waitIdle(t, q, all...)
	mu.Lock()
	for _, k := range all {
		if seen[k] != version[k] {
			t.Errorf("%s: last run saw version %d, the newest is %d (an add was lost)", k, seen[k], version[k])
		}
	}
	mu.Unlock()
	if n := totalLen(t, rdb, q); n != 0 {
		t.Errorf("streams keep %d entries once idle", n)
	}
	t.Logf("%d adds, %d runs, %d clashes", adds.Load(), runs.Load(), ex.clashes.Load())
}

// Semantics 3 within one process: the consumer's own reclaimer can claim a message that one of
// its handlers still runs (its renewals failed for a lease; made so here by setting the
// message's idle time). The two copies must not run at once: the second is not run at all.
func TestReclaimedOwnMessageNotRunTwice(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 1})
	ctx := context.Background()
	ex := newExclusion(t)
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	log := newRunLog()
	const lease = 2 * time.Second
	r := startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		who := fmt.Sprintf("fence %d", task.Fence)
		ex.enter(task.Key, who)
		defer ex.leave(task.Key, who)
		log.begin(task)
		started <- struct{}{}
		<-release
		return 0, nil
	}), ConsumerOptions{Name: "self", Concurrency: 2, Lease: lease})
	if err := q.Enqueue(ctx, "busy"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, started, "the handler")
	pending := func() []redis.XPendingExt {
		return rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: streamKey(0), Group: q.opts.Group, Start: "-", End: "+", Count: 10}).Val()
	}
	p := pending()
	if len(p) != 1 {
		t.Fatalf("pending = %+v", p)
	}
	eventually.Holds(t, waitLimit, func() bool {
		// As if its renewals had failed for ten leases; JUSTID leaves the delivery count alone.
		if err := rdb.Do(ctx, "XCLAIM", streamKey(0), q.opts.Group, "self", 0, p[0].ID, "IDLE", (10 * lease).Milliseconds(), "JUSTID").Err(); err != nil {
			t.Fatal(err)
		}
		now := pending()
		return len(now) == 1 && now[0].RetryCount >= 2
	}, "the consumer's reclaimer to claim its own running message")
	close(release)
	waitIdle(t, q, "busy")
	r.stop()
	if n := log.count("busy"); n != 1 {
		t.Errorf("busy handled %d times, want once: %+v", n, log.tasks("busy"))
	}
	if n := counterValue(t, r.c.metrics.reclaimed); n < 1 {
		t.Errorf("reclaimed = %v, want the message claimed again", n)
	}
	if n := handledCount(t, r.c, "ok"); n != 1 {
		t.Errorf("ok = %v, want the one run's outcome", n)
	}
}

// Semantics 4: 1,000 adds of a key during a slow run produce exactly one follow-up run, which
// starts after the slow one ended.
func TestAddsDuringRunCoalesceIntoOneFollowUp(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	log := newRunLog()
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		log.begin(task)
		defer log.finish(task.Key)
		if log.count(task.Key) == 1 {
			started <- struct{}{}
			<-release
		}
		return 0, nil
	}), ConsumerOptions{Concurrency: 4})
	if err := q.Enqueue(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, started, "the first run")
	enqueueConcurrently(t, q, "k", 10, 100)
	shard := q.Shard("k")
	if st := rdb.HGet(ctx, stateKey(shard), "k").Val(); !strings.HasPrefix(st, "d") {
		t.Errorf("state during the run = %q, want d (added again) and the run's fence", st)
	}
	if n := rdb.XLen(ctx, streamKey(shard)).Val(); n != 1 {
		t.Errorf("stream holds %d entries during the run, want the one being handled", n)
	}
	close(release)
	waitIdle(t, q, "k")
	if n := log.count("k"); n != 2 {
		t.Fatalf("key ran %d times, want 2", n)
	}
	start, end := log.times("k")
	if !start[1].After(end[0]) {
		t.Errorf("follow-up started %v before the first run ended", end[0].Sub(start[1]))
	}
	if n := totalLen(t, rdb, q); n != 0 {
		t.Errorf("streams keep %d entries", n)
	}
}

// Semantics 5: a handler's "again after d" runs the key again, not before d (less jitter).
func TestHandlerAgainRunsAfterDelay(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	const again = 300 * time.Millisecond
	const jitter = 0.2
	log := newRunLog()
	second := make(chan struct{})
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		log.begin(task)
		defer log.finish(task.Key)
		if log.count(task.Key) == 1 {
			return again, nil
		}
		close(second)
		return 0, nil
	}), ConsumerOptions{Jitter: jitter})
	if err := q.Enqueue(ctx, "poll"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, second, "the second run")
	start, end := log.times("poll")
	// Schedules are kept in whole milliseconds.
	if gap, min := start[1].Sub(end[0]), time.Duration(float64(again)*(1-jitter))-time.Millisecond; gap < min {
		t.Errorf("ran again %v after the first run ended, want at least %v", gap, min)
	}
	waitIdle(t, q, "poll")
	for _, task := range log.tasks("poll") {
		if task.Attempt != 1 {
			t.Errorf("a poll counted as a failed attempt: %+v", task)
		}
	}
	if n := rdb.ZCard(ctx, delayedKey(q.Shard("poll"))).Val(); n != 0 {
		t.Errorf("delayed set keeps %d keys", n)
	}
}

// Semantics 5: Enqueue of a delayed key drops its schedule and runs it now.
func TestEnqueueOfDelayedKeyRunsNow(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	if err := q.EnqueueAfter(ctx, "k", time.Hour); err != nil {
		t.Fatal(err)
	}
	handled := make(chan Task, 10)
	r := startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		handled <- task
		return 0, nil
	}), ConsumerOptions{})
	shard := q.Shard("k")
	if err := rdb.ZScore(ctx, delayedKey(shard), "k").Err(); err != nil {
		t.Fatalf("before Enqueue: ZSCORE: %v", err)
	}
	if err := q.Enqueue(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZScore(ctx, delayedKey(shard), "k").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("after Enqueue: ZSCORE err = %v, want nil reply", err)
	}
	waitFor(t, handled, "the key to run now")
	waitIdle(t, q, "k")
	r.stop()
	if len(handled) != 0 {
		t.Errorf("key ran %d more times", len(handled))
	}
}

// Semantics 5: delayed keys come back when due (EnqueueAfter, forwarded by the consumer).
func TestEnqueueAfterRunsWhenDue(t *testing.T) {
	_, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	handled := make(chan time.Time, 1)
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		handled <- time.Now()
		return 0, nil
	}), ConsumerOptions{})
	asked := time.Now()
	if err := q.EnqueueAfter(ctx, "later", 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	at := waitFor(t, handled, "the delayed key")
	if gap := at.Sub(asked); gap < 199*time.Millisecond {
		t.Errorf("delayed key ran after %v, want at least 200ms", gap)
	}
}

// Delayed keys keep coming back after Redis lost its script cache (a restart or failover):
// the forwarder runs its script in a pipeline, where a missing script is not loaded by itself.
func TestDelayedKeysSurviveScriptCacheLoss(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	handled := make(chan string, 10)
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		handled <- task.Key
		return 0, nil
	}), ConsumerOptions{})
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := q.EnqueueAfter(ctx, "later", 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if k := waitFor(t, handled, "the delayed key after SCRIPT FLUSH"); k != "later" {
		t.Errorf("handled %q", k)
	}
}

// Semantics 6: a failing key is retried with growing delays and its attempts count up; a
// success resets them.
func TestFailingKeyBacksOffAndResetsOnSuccess(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	const base = 50 * time.Millisecond
	const jitter = 0.2
	const failures = 4
	log := newRunLog()
	done := make(chan struct{}, 2)
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		log.begin(task)
		defer log.finish(task.Key)
		if log.count(task.Key) <= failures {
			return 0, fmt.Errorf("failure %d", task.Attempt)
		}
		done <- struct{}{}
		return 0, nil
	}), ConsumerOptions{BackoffBase: base, Jitter: jitter})
	if err := q.Enqueue(ctx, "flaky"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, done, "the key to succeed")
	waitIdle(t, q, "flaky")
	tasks := log.tasks("flaky")
	start, end := log.times("flaky")
	if len(tasks) != failures+1 {
		t.Fatalf("ran %d times, want %d", len(tasks), failures+1)
	}
	for i, task := range tasks {
		if task.Attempt != i+1 {
			t.Errorf("run %d has attempt %d", i+1, task.Attempt)
		}
		if i > 0 && task.Fence <= tasks[i-1].Fence {
			t.Errorf("fence did not grow: %d after %d", task.Fence, tasks[i-1].Fence)
		}
	}
	for n := 1; n <= failures; n++ {
		want := time.Duration(float64(base)*float64(int(1)<<(n-1))*(1-jitter)) - time.Millisecond
		if gap := start[n].Sub(end[n-1]); gap < want {
			t.Errorf("retry after attempt %d came %v after it, want at least %v", n, gap, want)
		}
	}
	shard := q.Shard("flaky")
	if err := rdb.HGet(ctx, attemptsKey(shard), "flaky").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("attempts not reset after success: %v", rdb.HGetAll(ctx, attemptsKey(shard)).Val())
	}
	if err := rdb.HGet(ctx, lastErrorKey(shard), "flaky").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("last error kept after success: %v", rdb.HGetAll(ctx, lastErrorKey(shard)).Val())
	}
	// Started afresh: the next run is attempt 1 again.
	if err := q.Enqueue(ctx, "flaky"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, done, "the key to run again")
	if task := log.tasks("flaky")[failures+1]; task.Attempt != 1 {
		t.Errorf("after a success the next run is attempt %d, want 1", task.Attempt)
	}
}

// Semantics 6: a key backing off takes no handler: with one handler, other keys are all
// handled while it waits.
func TestFailingKeyDoesNotBlockOthers(t *testing.T) {
	_, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	log := newRunLog()
	failed := make(chan struct{})
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		log.begin(task)
		if task.Key == "bad" {
			close(failed)
			return 0, errors.New("boom")
		}
		return 0, nil
	}), ConsumerOptions{Concurrency: 1, BackoffBase: 10 * time.Second})
	if err := q.Enqueue(ctx, "bad"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, failed, "the failing run")
	var others []string
	for i := range 20 {
		k := fmt.Sprint("good-", i)
		others = append(others, k)
		if err := q.Enqueue(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, q, others...)
	for _, k := range others {
		if n := log.count(k); n != 1 {
			t.Errorf("%s ran %d times", k, n)
		}
	}
	if n := log.count("bad"); n != 1 {
		t.Errorf("failing key ran %d times while backing off 10s", n)
	}
}

// Semantics 7: a key that always fails is dead-lettered after MaxDeliveries with its last
// error as the reason, the hook is told, and other keys keep flowing meanwhile.
func TestPoisonKeyDeadLetteredWhileOthersFlow(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4, MaxDeliveries: 3})
	ctx := context.Background()
	log := newRunLog()
	type dead struct{ key, reason string }
	hook := make(chan dead, 10)
	var goodDuringPoison atomic.Int64
	var poisonDead atomic.Bool
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		log.begin(task)
		if task.Key == "poison" {
			return 0, fmt.Errorf("boom at attempt %d", task.Attempt)
		}
		if !poisonDead.Load() {
			goodDuringPoison.Add(1)
		}
		time.Sleep(time.Millisecond)
		return 0, nil
	}), ConsumerOptions{Concurrency: 2, BackoffBase: 30 * time.Millisecond,
		OnDeadLetter: func(ctx context.Context, key, reason string) {
			if key == "poison" {
				poisonDead.Store(true)
			}
			hook <- dead{key, reason}
		}})
	if err := q.Enqueue(ctx, "poison"); err != nil {
		t.Fatal(err)
	}
	// Other keys are added all along, until the poison key is buried (or the test ends).
	feedCtx, stopFeeding := context.WithCancel(ctx)
	var feeder sync.WaitGroup
	var goodKeys []string
	feeder.Go(func() {
		for i := 0; feedCtx.Err() == nil; i++ {
			k := fmt.Sprint("good-", i)
			if err := q.Enqueue(feedCtx, k); err != nil {
				if feedCtx.Err() == nil {
					t.Error(err)
				}
				return
			}
			goodKeys = append(goodKeys, k)
			time.Sleep(2 * time.Millisecond) // a steady trickle, not a synchronisation
		}
	})
	t.Cleanup(func() { stopFeeding(); feeder.Wait() })
	d := waitFor(t, hook, "the dead-letter hook")
	stopFeeding()
	feeder.Wait()
	if d.key != "poison" || d.reason != "boom at attempt 3" {
		t.Errorf("hook got %+v, want poison with the last error", d)
	}
	if n := log.count("poison"); n != 3 {
		t.Errorf("poison key ran %d times, want 3", n)
	}
	if n := goodDuringPoison.Load(); n < 5 {
		t.Errorf("only %d other keys ran while the poison key was retried", n)
	}
	waitIdle(t, q, goodKeys...)
	for _, k := range goodKeys {
		if n := log.count(k); n != 1 {
			t.Errorf("%s ran %d times", k, n)
		}
	}
	letters, err := q.DeadLetters(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(letters) != 1 {
		t.Fatalf("dead letters = %+v, want one", letters)
	}
	l := letters[0]
	if l.Key != "poison" || l.Reason != "boom at attempt 3" || l.Attempts != 3 || time.Since(l.At) > time.Minute || !strings.HasPrefix(l.ID, fmt.Sprint(q.Shard("poison"), "/")) {
		t.Errorf("dead letter = %+v", l)
	}
	shard := q.Shard("poison")
	for name, key := range map[string]string{"state": stateKey(shard), "attempts": attemptsKey(shard), "last error": lastErrorKey(shard)} {
		if err := rdb.HGet(ctx, key, "poison").Err(); !errors.Is(err, redis.Nil) {
			t.Errorf("poison key's %s kept after burial", name)
		}
	}
	if n := totalLen(t, rdb, q); n != 0 {
		t.Errorf("streams keep %d entries", n)
	}
	if n := totalPending(t, rdb, q); n != 0 {
		t.Errorf("%d messages pending", n)
	}
}

// Semantics 6 and 7: a panicking handler is a failure, not a crash of the consumer.
func TestPanicIsAnError(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	log := newRunLog()
	r := startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		log.begin(task)
		if task.Key == "panicky" && task.Attempt == 1 {
			panic("nil map somewhere")
		}
		return 0, nil
	}), ConsumerOptions{Concurrency: 1})
	if err := q.Enqueue(ctx, "panicky"); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, waitLimit, func() bool { return log.count("panicky") == 1 }, "the panicking run")
	shard := q.Shard("panicky")
	eventually.Holds(t, waitLimit, func() bool {
		return rdb.HGet(ctx, lastErrorKey(shard), "panicky").Val() != ""
	}, "the panic recorded as the key's error")
	if e := rdb.HGet(ctx, lastErrorKey(shard), "panicky").Val(); !strings.Contains(e, "nil map somewhere") {
		t.Errorf("recorded error %q does not name the panic", e)
	}
	if err := q.Enqueue(ctx, "after"); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, waitLimit, func() bool { return log.count("panicky") == 2 }, "the retry after the panic")
	waitIdle(t, q, "panicky", "after")
	if n := log.count("after"); n != 1 {
		t.Errorf("the consumer did not survive: a later key ran %d times", n)
	}
	tasks := log.tasks("panicky")
	if len(tasks) != 2 || tasks[1].Attempt != 2 {
		t.Errorf("panicky runs = %+v, want a retry at attempt 2", tasks)
	}
	if n := counterValue(t, r.c.metrics.panics); n != 1 {
		t.Errorf("panics = %v, want 1", n)
	}
}

// Semantics 7 and the Handler contract: a terminal error dead-letters at once; Requeue puts
// the key back and it is handled from attempt 1.
func TestTerminalErrorThenRequeue(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4, MaxDeliveries: 5})
	ctx := context.Background()
	log := newRunLog()
	var fixed atomic.Bool
	hook := make(chan string, 10)
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		log.begin(task)
		if !fixed.Load() {
			return 0, Terminal(fmt.Errorf("image %s does not exist", task.Key))
		}
		return 0, nil
	}), ConsumerOptions{OnDeadLetter: func(ctx context.Context, key, reason string) { hook <- key + ": " + reason }})
	if err := q.Enqueue(ctx, "bad"); err != nil {
		t.Fatal(err)
	}
	if got := waitFor(t, hook, "the hook"); got != "bad: image bad does not exist" {
		t.Errorf("hook got %q", got)
	}
	if n := log.count("bad"); n != 1 {
		t.Errorf("ran %d times before the terminal error buried it, want 1", n)
	}
	letters, err := q.DeadLetters(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(letters) != 1 || letters[0].Key != "bad" || letters[0].Reason != "image bad does not exist" || letters[0].Attempts != 1 {
		t.Fatalf("dead letters = %+v", letters)
	}
	waitIdle(t, q, "bad")
	fixed.Store(true)
	key, err := q.Requeue(ctx, letters[0].ID)
	if err != nil || key != "bad" {
		t.Fatalf("Requeue = %q, %v", key, err)
	}
	eventually.Holds(t, waitLimit, func() bool { return log.count("bad") == 2 }, "the requeued key to run")
	waitIdle(t, q, "bad")
	if task := log.tasks("bad")[1]; task.Attempt != 1 {
		t.Errorf("requeued key ran at attempt %d, want 1 (it starts afresh)", task.Attempt)
	}
	if letters, _ := q.DeadLetters(ctx, 10); len(letters) != 0 {
		t.Errorf("dead letters after requeue = %+v", letters)
	}
	if _, err := q.Requeue(ctx, letters[0].ID); err == nil {
		t.Error("requeueing the same dead letter twice succeeded")
	}
	if n := totalLen(t, rdb, q); n != 0 {
		t.Errorf("streams keep %d entries", n)
	}
}

// Semantics 8: handled entries are deleted, so the stream drains to nothing, but an entry
// still pending stays in the stream and in XPENDING.
func TestStreamTrimmedButPendingKept(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 2})
	ctx := context.Background()
	started := make(chan struct{})
	release := make(chan struct{})
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		if task.Key == "stuck" {
			close(started)
			<-release
		}
		return 0, nil
	}), ConsumerOptions{Concurrency: 4})
	if err := q.Enqueue(ctx, "stuck"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, started, "the stuck handler")
	var keys []string
	for i := range 500 {
		k := fmt.Sprint("k", i)
		keys = append(keys, k)
		if err := q.Enqueue(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, q, keys...)
	shard := q.Shard("stuck")
	for s := range 2 {
		want := int64(0)
		if s == shard {
			want = 1
		}
		if n := rdb.XLen(ctx, streamKey(s)).Val(); n != want {
			t.Errorf("shard %d: XLEN = %d after 500 keys handled, want %d", s, n, want)
		}
		if n := pendingCount(t, rdb, q, s); n != want {
			t.Errorf("shard %d: pending = %d, want %d", s, n, want)
		}
	}
	if msgs := rdb.XRange(ctx, streamKey(shard), "-", "+").Val(); len(msgs) != 1 || msgs[0].Values["k"] != "stuck" {
		t.Errorf("stream of the stuck key holds %d entries, want only the stuck key's", len(msgs))
	}
	close(release)
	waitIdle(t, q, "stuck")
	if n := totalLen(t, rdb, q); n != 0 {
		t.Errorf("streams keep %d entries", n)
	}
}

// Semantics 8: the dead-letter stream is capped (approximately: MAXLEN ~ trims whole nodes).
func TestDeadLetterStreamCapped(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 1, DeadLetterMaxLen: 100})
	ctx := context.Background()
	const buried = 3000
	var n atomic.Int64
	all := make(chan struct{})
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		return 0, Terminal(errors.New("no"))
	}), ConsumerOptions{Concurrency: 8, OnDeadLetter: func(context.Context, string, string) {
		if n.Add(1) == buried {
			close(all)
		}
	}})
	for i := range buried {
		if err := q.Enqueue(ctx, fmt.Sprint("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, all, "every key buried")
	if l := rdb.XLen(ctx, deadKey(0)).Val(); l < 100 || l >= 1000 {
		t.Errorf("dead-letter stream holds %d of %d buried with a cap of 100", l, buried)
	}
}

// Semantics 9: dead consumers are removed from the group only when they hold nothing.
func TestIdleConsumersPrunedUnlessHoldingMessages(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 2})
	ctx := context.Background()
	if err := q.Enqueue(ctx, "held"); err != nil {
		t.Fatal(err)
	}
	shard := q.Shard("held")
	// "holder" read the message and died; "ghost" joined and died.
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: q.opts.Group, Consumer: "holder",
		Streams: []string{streamKey(shard), ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	for s := range 2 {
		if err := rdb.XGroupCreateConsumer(ctx, streamKey(s), q.opts.Group, "ghost").Err(); err != nil {
			t.Fatal(err)
		}
	}
	names := func(s int) map[string]int64 {
		cs, err := rdb.XInfoConsumers(ctx, streamKey(s), q.opts.Group).Result()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, c := range cs {
			out[c.Name] = c.Pending
		}
		return out
	}
	if got := names(shard); got["holder"] != 1 || len(got) != 2 {
		t.Fatalf("before: %v", got)
	}
	// Both dead ones are idle past the limit before the pruner looks.
	const after = 100 * time.Millisecond
	eventually.Holds(t, waitLimit, func() bool {
		for _, c := range rdb.XInfoConsumers(ctx, streamKey(shard), q.opts.Group).Val() {
			if c.Idle <= after {
				return false
			}
		}
		return true
	}, "dead consumers idle for %s", after)
	r := startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		return 0, nil
	}), ConsumerOptions{Name: "pruner", DeadConsumerAfter: after, Lease: time.Minute})
	eventually.Holds(t, waitLimit, func() bool {
		for s := range 2 {
			if _, ok := names(s)["ghost"]; ok {
				return false
			}
		}
		return true
	}, "the ghost consumer removed")
	got := names(shard)
	if got["holder"] != 1 {
		t.Errorf("after pruning: %v, want holder kept with its pending message", got)
	}
	if n := pendingCount(t, rdb, q, shard); n != 1 {
		t.Errorf("pending = %d, want the holder's 1", n)
	}
	r.stop()
}

// Semantics 10: on shutdown an in-flight handler finishes within ShutdownTimeout and its
// outcome is recorded; no new work is taken.
func TestShutdownLetsInFlightHandlerFinish(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 1})
	ctx := context.Background()
	started := make(chan struct{})
	var finished atomic.Bool
	var ctxErr atomic.Value
	log := newRunLog()
	r := startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		log.begin(task)
		if task.Key == "inflight" {
			close(started)
			time.Sleep(300 * time.Millisecond) // work that outlasts the start of shutdown
			ctxErr.Store(fmt.Sprint(ctx.Err()))
			finished.Store(true)
		}
		return 0, nil
	}), ConsumerOptions{Concurrency: 1, ShutdownTimeout: 10 * time.Second})
	if err := q.Enqueue(ctx, "inflight"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, started, "the handler")
	r.cancel()
	if err := q.Enqueue(ctx, "late"); err != nil {
		t.Fatal(err)
	}
	r.stop()
	if !finished.Load() {
		t.Fatal("Start returned before the in-flight handler finished")
	}
	if e := ctxErr.Load(); e != "<nil>" {
		t.Errorf("handler context ended (%v) within the shutdown timeout", e)
	}
	if w, _ := q.Waiting(ctx, "inflight"); w {
		t.Error("the finished handler's outcome was not recorded")
	}
	if n := log.count("late"); n != 0 {
		t.Errorf("a key added after shutdown started was handled")
	}
	// Only the late key's entry is left: waiting, or read by a last read and left pending.
	msgs := rdb.XRange(ctx, streamKey(0), "-", "+").Val()
	if len(msgs) != 1 || msgs[0].Values["k"] != "late" {
		t.Errorf("stream holds %+v, want only the late key", msgs)
	}
	if n := pendingCount(t, rdb, q, 0); n > 1 {
		t.Errorf("pending = %d", n)
	}
}

// Semantics 10: a handler that ignores its context and outlasts ShutdownTimeout has its
// context cancelled; Start returns once it does, and its message stays pending for others.
func TestShutdownTimeoutLeavesMessagePending(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 2})
	ctx := context.Background()
	started := make(chan struct{})
	cancelled := make(chan struct{})
	release := make(chan struct{})
	const timeout = 100 * time.Millisecond
	r := startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		close(started)
		go func() { <-ctx.Done(); close(cancelled) }()
		<-release // ignores ctx
		return 0, nil
	}), ConsumerOptions{ShutdownTimeout: timeout})
	if err := q.Enqueue(ctx, "stubborn"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, started, "the handler")
	stopping := time.Now()
	r.cancel()
	waitFor(t, cancelled, "the handler's context to be cancelled")
	if waited := time.Since(stopping); waited < timeout {
		t.Errorf("handler cancelled %v after shutdown began, before the %v timeout", waited, timeout)
	}
	if r.returned() {
		t.Error("Start returned while its handler still ran")
	}
	close(release)
	r.stop()
	shard := q.Shard("stubborn")
	if n := pendingCount(t, rdb, q, shard); n != 1 {
		t.Errorf("pending = %d, want the abandoned message", n)
	}
	if n := rdb.XLen(ctx, streamKey(shard)).Val(); n != 1 {
		t.Errorf("XLEN = %d, want 1", n)
	}
	if st := rdb.HGet(ctx, stateKey(shard), "stubborn").Val(); !strings.HasPrefix(st, "a") {
		t.Errorf("state = %q, want a (unfinished) and the run's fence", st)
	}
	// Another consumer finishes it.
	handled := make(chan Task, 1)
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		handled <- task
		return 0, nil
	}), ConsumerOptions{Name: "heir", Lease: 200 * time.Millisecond})
	if task := waitFor(t, handled, "the heir"); task.Key != "stubborn" || task.Attempt != 2 {
		t.Errorf("heir handled %+v", task)
	}
	waitIdle(t, q, "stubborn")
}

// consumerGoroutines returns the stacks of goroutines running in, or started by, a Consumer.
func consumerGoroutines() string {
	var out []string
	for _, g := range strings.Split(goroutineDump(), "\n\n") {
		if strings.Contains(g, "queue.(*Consumer)") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// Semantics 10: no goroutine a consumer starts outlives Start, and starting and stopping
// consumers leaves the process with as many goroutines as before.
func TestNoGoroutineOutlivesStart(t *testing.T) {
	_, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	// The client's connections exist before the baseline is taken.
	if err := q.Enqueue(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	if g := consumerGoroutines(); g != "" {
		t.Fatalf("consumer goroutines before the test:\n%s", g)
	}
	baseline := runtime.NumGoroutine()
	for i := range 3 {
		handled := make(chan struct{}, 1)
		c, err := q.NewConsumer(HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
			select {
			case handled <- struct{}{}:
			default:
			}
			time.Sleep(20 * time.Millisecond)
			return 50 * time.Millisecond, nil // leaves a delayed key behind
		}), testConsumerOptions(ConsumerOptions{Name: fmt.Sprint("round-", i), Lease: 300 * time.Millisecond,
			Concurrency: 3, Block: 300 * time.Millisecond}))
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { c.Start(cctx); close(done) }()
		if err := q.Enqueue(ctx, fmt.Sprint("leak-", i)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, handled, "a run")
		cancel()
		waitFor(t, done, "Start to return")
		// Goroutines that have signalled they are done may take a moment to exit, far less
		// than the 300ms a reader left blocked in XREADGROUP would linger.
		deadline := time.Now().Add(100 * time.Millisecond)
		for g := consumerGoroutines(); g != ""; g = consumerGoroutines() {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: goroutines outlive Start:\n%s", i, g)
			}
			time.Sleep(time.Millisecond)
		}
	}
	deadline := time.Now().Add(waitLimit)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after the consumers stopped, %d before:\n%s", runtime.NumGoroutine(), baseline, goroutineDump())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Semantics 3: a consumer whose message was taken over loses its lease: the handler's context
// ends at the next renewal and its finish does not acknowledge what another consumer owns.
func TestLostLeaseCancelsHandlerAndDoesNotAck(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 2})
	ctx := context.Background()
	started := make(chan struct{})
	ended := make(chan struct{})
	const lease = time.Second
	var runs atomic.Int64
	r := startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		if runs.Add(1) > 1 {
			return 0, nil // reclaimed from the thief after the test's checks
		}
		close(started)
		<-ctx.Done()
		close(ended)
		return 0, nil // a result the consumer must discard
	}), ConsumerOptions{Name: "a", Lease: lease})
	if err := q.Enqueue(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, started, "the handler")
	shard := q.Shard("k")
	p := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: streamKey(shard), Group: q.opts.Group, Start: "-", End: "+", Count: 10}).Val()
	if len(p) != 1 || p[0].Consumer != "a" {
		t.Fatalf("pending = %+v", p)
	}
	claimed := time.Now()
	if err := rdb.XClaimJustID(ctx, &redis.XClaimArgs{Stream: streamKey(shard), Group: q.opts.Group, Consumer: "thief",
		MinIdle: 0, Messages: []string{p[0].ID}}).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ended, "the handler's context to end")
	eventually.Holds(t, waitLimit, func() bool { return handledCount(t, r.c, "lost") == 1 }, "the run counted as lost")
	// The thief has not let its claim go unrenewed for a lease yet, so nothing reclaimed it.
	if time.Since(claimed) >= lease {
		t.Fatalf("took %v to notice; the consumer may have reclaimed the message since", time.Since(claimed))
	}
	p = rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: streamKey(shard), Group: q.opts.Group, Start: "-", End: "+", Count: 10}).Val()
	if len(p) != 1 || p[0].Consumer != "thief" {
		t.Errorf("pending = %+v, want the message still pending with thief", p)
	}
	if n := rdb.XLen(ctx, streamKey(shard)).Val(); n != 1 {
		t.Errorf("XLEN = %d, want 1", n)
	}
	if st := rdb.HGet(ctx, stateKey(shard), "k").Val(); !strings.HasPrefix(st, "a") {
		t.Errorf("state = %q, want a and the stale run's fence", st)
	}
	if n := handledCount(t, r.c, "ok"); n != 0 {
		t.Errorf("ok = %v: the stale run's outcome was recorded", n)
	}
}

// A stopping consumer hands back what it read but never began: another consumer takes those
// messages at once, long before their lease (ten minutes here) would let it reclaim them. A
// consumer reads only for free handlers, so what it can hold unbegun is what the read under
// way when shutdown starts returns.
func TestShutdownHandsBackUnbegunMessages(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 1})
	ctx := context.Background()
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	first := newRunLog()
	// A name of this run's own: a connection of an earlier run (-count) may still be blocked.
	clientName := fmt.Sprint("stopping-", time.Now().UnixNano())
	r := startConsumer(t, anotherProcess(t, q.opts, clientName), HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		first.begin(task)
		started <- struct{}{}
		<-release
		return 0, nil
	}), ConsumerOptions{Name: "stopping", Concurrency: 2, Lease: 10 * time.Minute, Block: time.Minute})
	if err := q.Enqueue(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, started, "the first handler")
	// One handler busy, and a read for the other waiting.
	eventually.Holds(t, waitLimit, func() bool { return blockedReaders(t, rdb, clientName) == 1 },
		"the consumer's read for its free handler")
	r.cancel()
	if err := q.Enqueue(ctx, "k2"); err != nil {
		t.Fatal(err)
	}
	close(release)
	r.stop()
	if n := pendingCount(t, rdb, q, 0); n != 0 {
		t.Fatalf("pending after shutdown = %d, want the unbegun message handed back", n)
	}
	if n := first.count("k2"); n != 0 {
		t.Fatalf("k2 ran %d times during shutdown", n)
	}
	// k1, k2, and k2 again: handed back as a new entry.
	left := rdb.XRange(ctx, streamKey(0), "-", "+").Val()
	if info := rdb.XInfoStream(ctx, streamKey(0)).Val(); len(left) != 1 || left[0].Values["k"] != "k2" || info.EntriesAdded != 3 {
		t.Errorf("stream holds %+v after shutdown, %d entries added, want k2 handed back as a third entry", left, info.EntriesAdded)
	}

	heir := newRunLog()
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		heir.begin(task)
		return 0, nil
	}), ConsumerOptions{Name: "heir", Lease: 10 * time.Minute})
	waitIdle(t, q, "k1", "k2")
	for _, k := range []string{"k1", "k2"} {
		if runs := first.count(k) + heir.count(k); runs != 1 {
			t.Errorf("%s ran %d times, want once", k, runs)
		}
	}
}

// Failures of one operation are logged once per interval whatever key they concern, and
// counted every time.
func TestErrorsLoggedOncePerOperation(t *testing.T) {
	_, q := newTestQueue(t, Options{Shards: 1})
	rec := &logtest.Recorder{}
	c, err := q.NewConsumer(HandlerFunc(func(context.Context, Task) (time.Duration, error) { return 0, nil }),
		testConsumerOptions(ConsumerOptions{Logger: rec.Logger()}))
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("redis is away")
	for i := range 50 {
		c.logError(context.Background(), "begin", boom, "key", fmt.Sprint("k", i))
	}
	c.logError(context.Background(), "finish", boom, "key", "k0")
	if n := len(rec.Since(0, "queue: begin")); n != 1 {
		t.Errorf("50 failed begins of 50 keys logged %d lines, want 1", n)
	}
	if n := len(rec.Since(0, "queue: finish")); n != 1 {
		t.Errorf("a failed finish logged %d lines, want 1", n)
	}
	if got := rec.Since(0, "queue: begin")[0].Attrs["key"]; got != "k0" {
		t.Errorf("the begin line names key %q, want k0", got)
	}
	if n := counterValue(t, c.metrics.errors); n != 51 {
		t.Errorf("errors counted %v, want 51", n)
	}
}
