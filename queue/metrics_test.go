package queue

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/computeql/computeql/eventually"
)

// gathered is one scrape: metric name → label string ("" or "k=v,…") → value.
type gathered map[string]map[string]float64

func gather(t *testing.T, reg *prometheus.Registry) gathered {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := gathered{}
	for _, mf := range mfs {
		byLabels := map[string]float64{}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(labels)
			key := fmt.Sprint(labels)
			switch {
			case m.Counter != nil:
				byLabels[key] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				byLabels[key] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				byLabels[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
		out[mf.GetName()] = byLabels
	}
	return out
}

// Semantics 11: depth per shard, pending, in-flight, handled by outcome, retried,
// dead-lettered, reclaimed and handler latency are exposed.
func TestMetrics(t *testing.T) {
	_, q := newTestQueue(t, Options{Shards: 3})
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	blocked := make(chan struct{})
	release := make(chan struct{})
	var flakyRuns atomic.Int64
	r := startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		switch task.Key {
		case "flaky":
			if flakyRuns.Add(1) == 1 {
				return 0, errors.New("once")
			}
		case "doomed":
			return 0, Terminal(errors.New("never"))
		case "poll":
			return time.Hour, nil
		case "blocker":
			close(blocked)
			<-release
		}
		return 0, nil
	}), ConsumerOptions{Registerer: reg, Concurrency: 4})
	for _, k := range []string{"ok1", "ok2", "flaky", "doomed", "poll"} {
		if err := q.Enqueue(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	// flaky's retry comes after a backoff, when it is not waiting.
	eventually.Holds(t, waitLimit, func() bool { return flakyRuns.Load() == 2 }, "flaky's retry")
	waitIdle(t, q, "ok1", "ok2", "flaky", "doomed", "poll")
	if err := q.Enqueue(ctx, "blocker"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, blocked, "the blocking handler")
	g := gather(t, reg)
	handled := g["computeql_queue_handled_total"]
	for outcome, want := range map[string]float64{"ok": 3, "retried": 1, "dead": 1, "requeued": 1} {
		if got := handled["[outcome="+outcome+"]"]; got != want {
			t.Errorf("handled_total{outcome=%q} = %v, want %v (all: %v)", outcome, got, want, handled)
		}
	}
	if got := g["computeql_queue_inflight"]["[]"]; got != 1 {
		t.Errorf("inflight = %v with one handler blocked, want 1", got)
	}
	if got := g["computeql_queue_handler_duration_seconds"]["[]"]; got != 6 {
		t.Errorf("latency observations = %v, want 6 finished runs", got)
	}
	blockerShard := fmt.Sprint("[shard=", q.Shard("blocker"), "]")
	for _, name := range []string{"computeql_queue_depth", "computeql_queue_pending", "computeql_queue_delayed", "computeql_queue_dead_letters"} {
		if len(g[name]) != 3 {
			t.Errorf("%s has %d series, want one per shard: %v", name, len(g[name]), g[name])
		}
	}
	for shard := range 3 {
		label := fmt.Sprint("[shard=", shard, "]")
		wantDepth := 0.0
		if label == blockerShard {
			wantDepth = 1
		}
		if got := g["computeql_queue_depth"][label]; got != wantDepth {
			t.Errorf("depth%s = %v, want %v", label, got, wantDepth)
		}
		if got := g["computeql_queue_pending"][label]; got != wantDepth {
			t.Errorf("pending%s = %v, want %v", label, got, wantDepth)
		}
	}
	sum := func(name string) float64 {
		var n float64
		for _, v := range g[name] {
			n += v
		}
		return n
	}
	if got := sum("computeql_queue_dead_letters"); got != 1 {
		t.Errorf("dead_letters = %v, want 1", got)
	}
	if got := g["computeql_queue_delayed"][fmt.Sprint("[shard=", q.Shard("poll"), "]")]; got != 1 {
		t.Errorf("delayed on the polled key's shard = %v, want 1", got)
	}
	for _, name := range []string{"computeql_queue_reclaimed_total", "computeql_queue_handler_panics_total", "computeql_queue_errors_total"} {
		if _, ok := g[name]; !ok {
			t.Errorf("%s is not exposed", name)
		}
	}
	close(release)
	waitIdle(t, q, "blocker")
	eventually.Holds(t, waitLimit, func() bool { return gather(t, reg)["computeql_queue_inflight"]["[]"] == 0 }, "inflight back to 0")
	r.stop()
	g = gather(t, reg)
	if got := g["computeql_queue_handled_total"]["[outcome=ok]"]; got != 4 {
		t.Errorf("handled_total{ok} = %v after the blocker finished, want 4", got)
	}
}

// TestConsumersOfOneProcessShareMetrics: a second consumer registering on the same registry
// reuses the first one's collectors, so both count into the same series.
func TestConsumersOfOneProcessShareMetrics(t *testing.T) {
	rdb := redisServer.Client(t)
	q, err := New(rdb, Options{Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	noop := HandlerFunc(func(context.Context, Task) (time.Duration, error) { return 0, nil })
	a, err := q.NewConsumer(noop, ConsumerOptions{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	b, err := q.NewConsumer(noop, ConsumerOptions{Registerer: reg})
	if err != nil {
		t.Fatalf("second consumer on one registry: %v", err)
	}
	a.metrics.handled.WithLabelValues("ok").Inc()
	b.metrics.handled.WithLabelValues("ok").Inc()
	if got := testutil.ToFloat64(a.metrics.handled.WithLabelValues("ok")); got != 2 {
		t.Errorf("shared handled counter = %v, want 2", got)
	}
}
