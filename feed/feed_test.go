package feed_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/feed"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/metrictest"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/store"
)

var redisServer *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &redisServer) }

var quiet = slog.New(slog.DiscardHandler)

type env struct {
	rdb  *redis.Client
	st   *store.Store
	feed *feed.Feed
	n    int
}

func newEnv(t *testing.T, opts feed.Options) *env {
	t.Helper()
	rdb := redisServer.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	opts.Logger, opts.Block = quiet, 20*time.Millisecond
	e := &env{rdb: rdb, st: store.New(rdb)}
	e.feed = feed.New(ctx, e.st, opts)
	t.Cleanup(func() { cancel(); e.feed.Wait() })
	return e
}

func storeOn(rdb *redis.Client) *store.Store { return store.New(rdb) }

// createIn stores an instance directly (one CREATED event) and returns it as stored.
func createIn(tb testing.TB, st *store.Store, org, project string, n int) *instance.Instance {
	tb.Helper()
	id, _ := uuid.NewV7()
	now := time.Now()
	inst := &instance.Instance{ID: id.String(), OrganizationID: org, ProjectID: project,
		Spec: instance.Spec{Name: fmt.Sprint("b", n), NetworkID: "net", CreatedAt: now, UpdatedAt: now, Charge: quota.Amounts{}}}
	if r, err := st.Create(context.Background(), inst, inst.Name, quota.Amounts{quota.Servers: 1 << 40}, instance.Idempotency{}); err != nil || r != nil {
		tb.Fatal(err, r)
	}
	inst.Generation, inst.StatusVersion = 1, 1
	return inst
}

// commit creates an instance in the project: one CREATED event in the log.
func (e *env) commit(t *testing.T, project string) string {
	t.Helper()
	id, _ := uuid.NewV7()
	e.n++
	now := time.Now()
	inst := &instance.Instance{ID: id.String(), OrganizationID: "acme", ProjectID: project,
		Spec: instance.Spec{Name: fmt.Sprint("n", e.n), NetworkID: "net", CreatedAt: now, UpdatedAt: now, Charge: quota.Amounts{}}}
	big := quota.Amounts{quota.Servers: 1 << 40}
	if r, err := e.st.Create(context.Background(), inst, inst.Name, big, instance.Idempotency{}); err != nil || r != nil {
		t.Fatal(err, r)
	}
	return inst.ID
}

// watch is a subscription whose notifications wake the test that reads it.
type watch struct {
	*feed.Subscription
	wake chan struct{}
}

func subscribe(f *feed.Feed, ctx context.Context, org, instanceID, after string, match func(*instance.Record) bool) (*watch, []instance.Record, error) {
	w := &watch{wake: make(chan struct{}, 1)}
	s, replay, err := f.SubscribeInstance(ctx, org, instanceID, after, match, func() {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	})
	w.Subscription = s
	return w, replay, err
}

var errNoEventInTime = errors.New("no event in time")

// await returns the next event, waiting for it until timeout: errNoEventInTime when the
// timeout passes first, the subscription's error when it ended.
func (w *watch) await(timeout <-chan time.Time) (*instance.Record, error) {
	for {
		if r, ok := w.Next(); ok {
			return r, nil
		}
		if w.Ended() {
			return nil, fmt.Errorf("subscription ended: %v", w.Err())
		}
		select {
		case <-w.wake:
		case <-timeout:
			return nil, errNoEventInTime
		}
	}
}

func receive(t *testing.T, s *watch, n int) []string {
	t.Helper()
	var ids []string
	timeout := time.After(10 * time.Second)
	for len(ids) < n {
		r, err := s.await(timeout)
		if err != nil {
			t.Fatalf("after %d of %d events: %v", len(ids), n, err)
		}
		ids = append(ids, r.Instance.ID)
	}
	return ids
}

func all(*instance.Record) bool { return true }

func TestLiveEventsInOrderAndFiltered(t *testing.T) {
	e := newEnv(t, feed.Options{})
	sub, replay, err := subscribe(e.feed, context.Background(), "acme", "", "", func(r *instance.Record) bool { return r.Instance.ProjectID == "web" })
	if err != nil || replay != nil {
		t.Fatal(err, replay)
	}
	defer sub.Close()
	var want []string
	for i := range 20 {
		project := "web"
		if i%2 == 1 {
			project = "data"
		}
		id := e.commit(t, project)
		if project == "web" {
			want = append(want, id)
		}
	}
	if got := receive(t, sub, len(want)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

// TestReplayThenLiveHasNoGapAndNoDuplicate: events after the cursor are replayed, events
// committed meanwhile follow live, and each arrives once, in the log's order.
func TestReplayThenLiveHasNoGapAndNoDuplicate(t *testing.T) {
	e := newEnv(t, feed.Options{Buffer: 1000})
	var want []string
	first := e.commit(t, "web")
	for range 5 {
		want = append(want, e.commit(t, "web"))
	}
	hist, _, err := e.st.History(context.Background(), "acme", first, "", 1)
	if err != nil || len(hist) != 1 {
		t.Fatal(err, hist)
	}
	var wg sync.WaitGroup
	var live []string
	wg.Go(func() {
		for range 50 {
			live = append(live, e.commit(t, "web"))
		}
	})
	sub, replay, err := subscribe(e.feed, context.Background(), "acme", "", hist[0].Cursor, all)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	wg.Wait()
	want = append(want, live...)
	var got []string
	for _, r := range replay {
		got = append(got, r.Instance.ID)
	}
	got = append(got, receive(t, sub, len(want)-len(got))...)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %d events, want %d, in order:\n%v\n%v", len(got), len(want), got, want)
	}
}

func TestExpiredCursor(t *testing.T) {
	e := newEnv(t, feed.Options{})
	first := e.commit(t, "web")
	hist, _, _ := e.st.History(context.Background(), "acme", first, "", 1)
	for range 3 {
		e.commit(t, "web")
	}
	e.rdb.XTrimMaxLen(context.Background(), "cq:{o:acme}:events", 1)
	if _, _, err := subscribe(e.feed, context.Background(), "acme", "", hist[0].Cursor, all); !errors.Is(err, instance.ErrCursorExpired) {
		t.Errorf("err = %v, want ErrCursorExpired", err)
	}
}

// TestSlowSubscriberIsCutOffAndOthersAreNot: a subscriber that does not read is ended with
// ErrSlowConsumer; another on the same reader receives every event. The metrics count both.
func TestSlowSubscriberIsCutOffAndOthersAreNot(t *testing.T) {
	e := newEnv(t, feed.Options{Buffer: 4})
	reg := prometheus.NewRegistry()
	if err := e.feed.Register(reg); err != nil {
		t.Fatal(err)
	}
	slow, _, _ := subscribe(e.feed, context.Background(), "acme", "", "", all)
	defer slow.Close()
	fast, _, _ := subscribe(e.feed, context.Background(), "acme", "", "", all)
	defer fast.Close()
	var got []string
	for range 20 {
		e.commit(t, "web")
		got = append(got, receive(t, fast, 1)...)
	}
	if len(got) != 20 {
		t.Errorf("fast subscriber got %d events", len(got))
	}
	n := 0
	for _, ok := slow.Next(); ok; _, ok = slow.Next() {
		n++
	}
	if !slow.Ended() || slow.Err() != feed.ErrSlowConsumer || n != 4 {
		t.Errorf("slow subscriber: %d events buffered, err %v; want 4 and ErrSlowConsumer", n, slow.Err())
	}
	// The metrics tell the same story: 20 events to the fast subscriber and 4 to the slow
	// one, one dropped, which cut the slow one off; one reader stays for the fast one.
	eventually.Holds(t, 5*time.Second, func() bool { return metrictest.Value(t, reg, "computeql_subscriptions_active") == 1 },
		"active subscriptions %v, want 1", metrictest.Value(t, reg, "computeql_subscriptions_active"))
	// A delivery is counted just after its send, so the subscriber can hold an event a moment
	// before the counter shows it: wait for the figures rather than read them once.
	for name, want := range map[string]float64{
		"computeql_feed_events_delivered_total": 24,
		"computeql_feed_events_dropped_total":   1,
		"computeql_feed_readers":                1,
	} {
		eventually.Holds(t, 5*time.Second, func() bool { return metrictest.Value(t, reg, name) == want },
			"%s = %v, want %v", name, eventually.Lazy(func() string { return fmt.Sprint(metrictest.Value(t, reg, name)) }), want)
	}
}

// TestReaderCatchesUpAfterLosingRedis: killing the reader's connection loses no event.
func TestReaderCatchesUpAfterLosingRedis(t *testing.T) {
	e := newEnv(t, feed.Options{})
	sub, _, _ := subscribe(e.feed, context.Background(), "acme", "", "", all)
	defer sub.Close()
	var want []string
	for i := range 10 {
		if i == 5 {
			if err := e.rdb.ClientKillByFilter(context.Background(), "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
				t.Fatal(err)
			}
		}
		want = append(want, e.commit(t, "web"))
	}
	if got := receive(t, sub, 10); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after a lost connection got %v\nwant %v", got, want)
	}
}

// TestThousandSubscriptionsLeaveNoGoroutines: readers start and stop with their subscribers.
func TestThousandSubscriptionsLeaveNoGoroutines(t *testing.T) {
	e := newEnv(t, feed.Options{})
	before := runtime.NumGoroutine()
	subs := make([]*watch, 1000)
	for i := range subs {
		s, _, err := subscribe(e.feed, context.Background(), fmt.Sprint("org", i%10), "", "", all)
		if err != nil {
			t.Fatal(err)
		}
		subs[i] = s
	}
	for _, s := range subs {
		s.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		runtime.Gosched()
		time.Sleep(10 * time.Millisecond) // lets the stopped readers' final blocking reads return
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after closing 1,000 subscriptions, %d before", n, before)
	}
}

// TestInstanceSubscriptions: a subscription to one instance gets that instance's events only,
// replayed and live, beside organization-wide ones that get every event; closing one leaves
// the others of its instance subscribed.
func TestInstanceSubscriptions(t *testing.T) {
	e := newEnv(t, feed.Options{})
	reg := prometheus.NewRegistry()
	if err := e.feed.Register(reg); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, b := createIn(t, e.st, "acme", "web", 1), createIn(t, e.st, "acme", "web", 2)
	warn := func(inst *instance.Instance, msg string) {
		t.Helper()
		if _, err := e.st.Warn(ctx, inst, time.Now(), msg); err != nil {
			t.Fatal(err)
		}
	}
	warn(a, "a0")
	warn(b, "b0")
	hist, _, err := e.st.History(ctx, "acme", a.ID, "", 1) // a's CREATED: replay from there
	if err != nil || len(hist) != 1 {
		t.Fatal(err, hist)
	}
	wide, _, _ := subscribe(e.feed, ctx, "acme", "", "", all)
	defer wide.Close()
	a1, replay, err := subscribe(e.feed, ctx, "acme", a.ID, hist[0].Cursor, all)
	if err != nil {
		t.Fatal(err)
	}
	defer a1.Close()
	a2, _, _ := subscribe(e.feed, ctx, "acme", a.ID, "", all)
	defer a2.Close()
	bOnly, _, _ := subscribe(e.feed, ctx, "acme", b.ID, "", all)
	defer bOnly.Close()
	var replayed []string
	for _, r := range replay {
		replayed = append(replayed, r.Message)
	}
	if fmt.Sprint(replayed) != "[a0]" {
		t.Errorf("replay to a's subscription = %v, want [a0]", replayed)
	}

	warn(a, "a1")
	warn(b, "b1")
	warn(a, "a2")
	for _, tt := range []struct {
		name string
		sub  *watch
		want string
	}{
		{"organization-wide", wide, "[a1 b1 a2]"},
		{"first of a", a1, "[a1 a2]"},
		{"second of a", a2, "[a1 a2]"},
		{"b", bOnly, "[b1]"},
	} {
		if got := messages(t, tt.sub, 1+strings.Count(tt.want, " ")); fmt.Sprint(got) != tt.want {
			t.Errorf("%s got %v, want %v", tt.name, got, tt.want)
		}
	}

	a1.Close()
	warn(a, "a3")
	if got := messages(t, a2, 1); fmt.Sprint(got) != "[a3]" {
		t.Errorf("a's remaining subscription got %v after the other closed, want [a3]", got)
	}
	if got := messages(t, wide, 1); fmt.Sprint(got) != "[a3]" {
		t.Errorf("organization-wide got %v, want [a3]", got)
	}
	if got := metrictest.Value(t, reg, "computeql_subscriptions_active"); got != 3 {
		t.Errorf("active subscriptions = %v, want 3", got)
	}
	if r, ok := bOnly.Next(); ok {
		t.Errorf("b's subscription got %s's %q", r.Instance.ID, r.Message)
	}
}

// messages receives n events and returns their messages.
func messages(t *testing.T, s *watch, n int) []string {
	t.Helper()
	var out []string
	timeout := time.After(10 * time.Second)
	for len(out) < n {
		r, err := s.await(timeout)
		if err != nil {
			t.Fatalf("after %d of %d events: %v", len(out), n, err)
		}
		out = append(out, r.Message)
	}
	return out
}

// Subscribers coming and going on one organization at once never leave a subscription attached
// to a reader that has stopped (the last subscriber's leave stops it). One goroutine flaps a
// subscription, taking the organization through no subscriber at all (its reader stopped and
// started again) over and over; meanwhile another subscribes, commits an event, and must
// receive it, each time.
func TestChurnLeavesNoSubscriptionOnAStoppedReader(t *testing.T) {
	e := newEnv(t, feed.Options{})
	ctx, stop := context.WithCancel(context.Background())
	var flapping sync.WaitGroup
	flapping.Go(func() {
		for ctx.Err() == nil {
			s, _, err := subscribe(e.feed, ctx, "acme", "", "", all)
			if err != nil {
				if ctx.Err() == nil {
					t.Error(err)
				}
				return
			}
			s.Close()
		}
	})
	defer func() { stop(); flapping.Wait() }()
	for i := range 1000 {
		s, _, err := subscribe(e.feed, context.Background(), "acme", "", "", all)
		if err != nil {
			t.Fatal(err)
		}
		id := e.commit(t, "web")
		if got := receive(t, s, 1); got[0] != id {
			t.Fatalf("subscription %d got %s, want %s", i, got[0], id)
		}
		s.Close()
	}
}
