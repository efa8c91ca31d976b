package queue

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/redistest"
)

var redisServer *redistest.Server

func TestMain(m *testing.M) {
	if os.Getenv(helperRedisEnv) != "" {
		// A worker process re-executed by TestCrashedWorkerMessageFinishedByAnother: it talks
		// to its parent's redis-server and is SIGKILLed, so it must not start one of its own
		// (it would outlive the kill).
		os.Exit(m.Run())
	}
	redistest.Main(m, &redisServer)
}

func TestSmokeEveryKeyHandledOnce(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	var mu sync.Mutex
	seen := map[string]int{}
	all := make(chan struct{})
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		mu.Lock()
		defer mu.Unlock()
		seen[task.Key]++
		if len(seen) == 100 {
			close(all)
		}
		return 0, nil
	}), ConsumerOptions{})
	for i := range 100 {
		if err := q.Enqueue(ctx, fmt.Sprint("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, all, "100 keys handled")
	for i := range 100 {
		waitIdle(t, q, fmt.Sprint("k", i))
	}
	mu.Lock()
	defer mu.Unlock()
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s handled %d times", k, n)
		}
	}
	for shard := range 4 {
		if n := rdb.XLen(ctx, streamKey(shard)).Val(); n != 0 {
			t.Errorf("shard %d stream keeps %d entries", shard, n)
		}
		if n := rdb.HLen(ctx, stateKey(shard)).Val(); n != 0 {
			t.Errorf("shard %d state keeps %d keys", shard, n)
		}
	}
}

// Semantics 1: a key always maps to the same shard, and keys spread over all shards.
func TestShardIsStableAndSpread(t *testing.T) {
	q, err := New(nil, Options{Shards: 16})
	if err != nil {
		t.Fatal(err)
	}
	other, _ := New(nil, Options{Shards: 16}) // another process with the same options
	perShard := make([]int, 16)
	const keys = 1600
	for i := range keys {
		k := fmt.Sprintf("instance-%d", i)
		s := q.Shard(k)
		if s < 0 || s >= 16 {
			t.Fatalf("Shard(%q) = %d, out of range", k, s)
		}
		for range 3 {
			if again := q.Shard(k); again != s {
				t.Fatalf("Shard(%q) = %d, then %d", k, s, again)
			}
		}
		if o := other.Shard(k); o != s {
			t.Fatalf("Shard(%q) = %d in one queue and %d in another with the same options", k, s, o)
		}
		perShard[s]++
	}
	for s, n := range perShard {
		// 100 expected per shard; a shard with fewer than a third or more than three times
		// that is not a spread.
		if n < keys/16/3 || n > keys/16*3 {
			t.Errorf("shard %d got %d of %d keys: %v", s, n, keys, perShard)
		}
	}
	one, _ := New(nil, Options{Shards: 1})
	if s := one.Shard("anything"); s != 0 {
		t.Errorf("with one shard, Shard = %d", s)
	}
}

// Semantics 1: every key one script touches carries its shard's hash tag, and shards differ.
func TestShardKeysShareOneHashTag(t *testing.T) {
	helpers := map[string]func(int) string{
		"stream": streamKey, "state": stateKey, "attempts": attemptsKey, "lastError": lastErrorKey,
		"delayed": delayedKey, "fence": fenceKey, "dead": deadKey,
	}
	hashTag := func(key string) string {
		// Redis Cluster hashes only the part between the first '{' and the next '}'.
		open := strings.IndexByte(key, '{')
		if open < 0 {
			return ""
		}
		end := strings.IndexByte(key[open+1:], '}')
		if end <= 0 {
			return ""
		}
		return key[open+1 : open+1+end]
	}
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { cluster.Close() })
	cq, err := New(cluster, Options{Shards: 1024})
	if err != nil {
		t.Fatal(err)
	}
	for _, shard := range []int{0, 1, 7, 15, 1023} {
		want := fmt.Sprintf("q%d", shard)
		seen := map[string]string{}
		for name, f := range helpers {
			key := f(shard)
			if tag := hashTag(key); tag != want {
				t.Errorf("%s key of shard %d is %q: hash tag %q, want %q", name, shard, key, tag, want)
			}
			if prev, dup := seen[key]; dup {
				t.Errorf("%s and %s keys of shard %d are both %q", prev, name, shard, key)
			}
			seen[key] = name
		}
		// The consumer's script key lists are built from these helpers; on a Redis Cluster
		// each shard counts fences on its own counter.
		for name, keys := range map[string][]string{"begin": cq.keys[shard].begin, "take": cq.keys[shard].take,
			"finish": cq.keys[shard].finish, "enqueue": cq.keys[shard].enqueue, "bury": buryShardKeys(shard)} {
			for _, k := range keys {
				if tag := hashTag(k); tag != want {
					t.Errorf("%s keys of shard %d on a cluster hold %q with hash tag %q", name, shard, k, tag)
				}
			}
		}
	}
	if streamKey(1) == streamKey(11) || hashTag(streamKey(1)) == hashTag(streamKey(11)) {
		t.Errorf("shards 1 and 11 share %q", streamKey(1))
	}
}

func TestOptionsValidated(t *testing.T) {
	for _, o := range []Options{{Shards: -1}, {Shards: 1025}, {MaxDeliveries: -1}} {
		if _, err := New(nil, o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
	q, err := New(nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if q.opts.Shards != 16 || q.opts.Group != "workers" || q.opts.MaxDeliveries != 10 || q.opts.DeadLetterMaxLen != 100_000 {
		t.Errorf("defaults = %+v", q.opts)
	}
	for _, o := range []ConsumerOptions{{Concurrency: -1}, {Lease: -time.Second}, {Jitter: 1}, {Jitter: -0.1}} {
		if _, err := q.NewConsumer(HandlerFunc(nil), o); err == nil {
			t.Errorf("NewConsumer(%+v) accepted", o)
		}
	}
}

func TestSetupIsIdempotentAndKeepsEarlierMessages(t *testing.T) {
	rdb := redisServer.Client(t)
	q, err := New(rdb, Options{Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A key added before any process set the queue up is not lost.
	if err := q.Enqueue(ctx, "early"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := q.Setup(ctx); err != nil {
			t.Fatal(err)
		}
	}
	handled := make(chan Task, 1)
	startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		handled <- task
		return 0, nil
	}), ConsumerOptions{})
	if task := waitFor(t, handled, "the early key"); task.Key != "early" {
		t.Errorf("handled %q", task.Key)
	}
}

// Semantics 1: consumers of one group share the work, and no key is handled twice.
func TestConsumersShareTheWork(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	var mu sync.Mutex
	byConsumer := map[string]map[string]int{}
	perKey := map[string]int{}
	const keys = 40
	all := make(chan struct{})
	handler := func(name string) Handler {
		return HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
			time.Sleep(10 * time.Millisecond) // work, so that one consumer cannot take everything
			mu.Lock()
			defer mu.Unlock()
			byConsumer[name][task.Key]++
			perKey[task.Key]++
			if len(perKey) == keys {
				close(all)
			}
			return 0, nil
		})
	}
	for _, name := range []string{"a", "b"} {
		byConsumer[name] = map[string]int{}
		startConsumer(t, anotherProcess(t, q.opts, name), handler(name), ConsumerOptions{Name: name, Concurrency: 1})
	}
	// Both consumers wait in XREADGROUP before any work arrives (a blocked read does not
	// show in XINFO CONSUMERS on Redis 7.0, so look at the clients).
	eventually.Holds(t, waitLimit, func() bool {
		return blockedReaders(t, rdb, "a") > 0 && blockedReaders(t, rdb, "b") > 0
	}, "both consumers to read")
	for i := range keys {
		if err := q.Enqueue(ctx, fmt.Sprint("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, all, "every key handled")
	mu.Lock()
	defer mu.Unlock()
	for name, ks := range byConsumer {
		if len(ks) == 0 {
			t.Errorf("consumer %s handled no key: %v", name, byConsumer)
		}
	}
	for k, n := range perKey {
		if n != 1 {
			t.Errorf("%s handled %d times", k, n)
		}
	}
}

// Semantics 4, without a consumer: many adds of a waiting key leave one message.
func TestEnqueueOfWaitingKeyCoalesces(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	enqueueConcurrently(t, q, "k", 10, 100)
	shard := q.Shard("k")
	if n := rdb.XLen(ctx, streamKey(shard)).Val(); n != 1 {
		t.Errorf("1000 adds of a waiting key left %d stream entries, want 1", n)
	}
	if n := totalLen(t, rdb, q); n != 1 {
		t.Errorf("all shards hold %d entries, want 1", n)
	}
	msgs := rdb.XRange(ctx, streamKey(shard), "-", "+").Val()
	if st := rdb.HGet(ctx, stateKey(shard), "k").Val(); len(msgs) != 1 || st != "q"+msgs[0].ID {
		t.Errorf("state = %q, want q and the id of the waiting message %+v", st, msgs)
	}
	if w, err := q.Waiting(ctx, "k"); err != nil || !w {
		t.Errorf("Waiting = %v, %v", w, err)
	}
	if w, err := q.Waiting(ctx, "other"); err != nil || w {
		t.Errorf("Waiting(other) = %v, %v", w, err)
	}
}

// Up to maxAdds Enqueues make a round trip each at once; those that come while maxAdds are
// under way wait and share the next round trips, and every key is added.
func TestEnqueueRoundTripsBoundedThenShared(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4})
	gate := &scriptGate{open: make(chan struct{}), entered: make(chan struct{}, 100)}
	rdb.AddHook(gate)
	ctx := context.Background()
	var wg sync.WaitGroup
	var keys []string
	enqueue := func(key string) {
		keys = append(keys, key)
		wg.Go(func() {
			if err := q.Enqueue(ctx, key); err != nil {
				t.Error(err)
			}
		})
	}
	for i := range maxAdds {
		enqueue(fmt.Sprintf("first-%d", i))
	}
	for range maxAdds {
		select {
		case <-gate.entered:
		case <-time.After(waitLimit):
			t.Fatal("the first Enqueues did not each make a round trip")
		}
	}
	const more = 20
	for i := range more {
		enqueue(fmt.Sprintf("more-%d", i))
	}
	eventually.Holds(t, waitLimit, func() bool { return q.adds.Waiting() == more }, "the later Enqueues waiting")
	close(gate.open)
	wg.Wait()
	gate.mu.Lock()
	most, calls := gate.most, gate.calls
	gate.mu.Unlock()
	if most != maxAdds {
		t.Errorf("at most %d enqueue round trips were under way at once, want %d", most, maxAdds)
	}
	if calls >= maxAdds+more {
		t.Errorf("%d keys took %d round trips: the waiting ones did not share", maxAdds+more, calls)
	}
	for _, k := range keys {
		if w, err := q.Waiting(ctx, k); err != nil || !w {
			t.Errorf("%s: Waiting = %v, %v", k, w, err)
		}
	}
}

// scriptGate holds script calls (EVALSHA) until open is closed, counting them and the most
// under way at once; entered receives one value per call held.
type scriptGate struct {
	open    chan struct{}
	entered chan struct{}

	mu               sync.Mutex
	calls, now, most int
}

func (g *scriptGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *scriptGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "evalsha" {
			return next(ctx, cmd)
		}
		g.mu.Lock()
		g.calls++
		g.now++
		g.most = max(g.most, g.now)
		g.mu.Unlock()
		select {
		case <-g.open:
		default:
			g.entered <- struct{}{}
			<-g.open
		}
		err := next(ctx, cmd)
		g.mu.Lock()
		g.now--
		g.mu.Unlock()
		return err
	}
}

func (g *scriptGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Semantics 5: EnqueueAfter keeps the earlier of two schedules.
func TestEnqueueAfterKeepsEarlierSchedule(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 4})
	now := time.UnixMilli(1_700_000_000_000)
	q.opts.Now = func() time.Time { return now }
	ctx := context.Background()
	score := func() float64 {
		s, err := rdb.ZScore(ctx, delayedKey(q.Shard("k")), "k").Result()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if err := q.EnqueueAfter(ctx, "k", time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, want := score(), float64(now.Add(time.Minute).UnixMilli()); got != want {
		t.Errorf("score = %v, want %v", got, want)
	}
	if err := q.EnqueueAfter(ctx, "k", time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, want := score(), float64(now.Add(time.Minute).UnixMilli()); got != want {
		t.Errorf("a later schedule replaced the earlier: score = %v, want %v", got, want)
	}
	if err := q.EnqueueAfter(ctx, "k", time.Second); err != nil {
		t.Fatal(err)
	}
	if got, want := score(), float64(now.Add(time.Second).UnixMilli()); got != want {
		t.Errorf("an earlier schedule did not replace the later: score = %v, want %v", got, want)
	}
	if n := totalLen(t, rdb, q); n != 0 {
		t.Errorf("a delayed key is in the stream already (%d entries)", n)
	}
	if w, err := q.Waiting(ctx, "k"); err != nil || w {
		t.Errorf("a scheduled key not yet due: Waiting = %v, %v", w, err)
	}
}

func TestRequeueUnknownDeadLetter(t *testing.T) {
	_, q := newTestQueue(t, Options{Shards: 4})
	ctx := context.Background()
	for _, id := range []string{"0/1-1", "3/99999-0", "4/1-1", "-1/1-1", "garbage", ""} {
		if key, err := q.Requeue(ctx, id); err == nil {
			t.Errorf("Requeue(%q) = %q, no error", id, key)
		}
	}
}

// On a Redis Cluster no script of another package can reach the queue's keys, which live on
// shards of their own: Addition says so rather than give keys a script would fail on
// (CROSSSLOT); on a standalone Redis it gives the key's shard's keys and the key.
func TestAdditionNeedsAStandaloneRedis(t *testing.T) {
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { cluster.Close() })
	cq, err := New(cluster, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cq.Addition(context.Background(), "k"); !errors.Is(err, ErrOtherShards) {
		t.Errorf("Addition on a cluster: %v, want ErrOtherShards", err)
	}
	_, q := newTestQueue(t, Options{Shards: 4})
	add, err := q.Addition(context.Background(), "k")
	shard := q.Shard("k")
	if want := []string{streamKey(shard), stateKey(shard), delayedKey(shard)}; err != nil || !slices.Equal(add.Keys, want) || len(add.Args) != 1 || add.Args[0] != "k" {
		t.Errorf("Addition = %+v, %v; want keys %v and the key", add, err, want)
	}
}
