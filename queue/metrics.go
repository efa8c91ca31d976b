package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// consumerMetrics are a consumer's own counts plus, read from Redis when scraped, each shard's
// backlog.
type consumerMetrics struct {
	handled   *prometheus.CounterVec
	reclaimed prometheus.Counter
	panics    prometheus.Counter
	errors    prometheus.Counter
	inflight  prometheus.Gauge
	latency   prometheus.Histogram
}

func newConsumerMetrics(q *Queue, reg prometheus.Registerer) (*consumerMetrics, error) {
	m := &consumerMetrics{
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "computeql_queue_handled_total",
			Help: "Handler runs by outcome: ok, requeued (asked to run again later), retried (failed, backing off), dead (dead-lettered), lost (another consumer took the message over).",
		}, []string{"outcome"}),
		reclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "computeql_queue_reclaimed_total",
			Help: "Messages taken over from consumers that stopped renewing them.",
		}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "computeql_queue_handler_panics_total",
			Help: "Handler panics, recovered and treated as failures.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "computeql_queue_errors_total",
			Help: "Failed Redis calls of the consumer's own loops (they retry by themselves).",
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "computeql_queue_inflight",
			Help: "Handlers running now in this process.",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "computeql_queue_handler_duration_seconds",
			Help:    "Time a handler takes.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 14),
		}),
	}
	if reg == nil {
		return m, nil
	}
	var errs [7]error
	m.handled, errs[0] = register(reg, m.handled)
	m.reclaimed, errs[1] = register(reg, m.reclaimed)
	m.panics, errs[2] = register(reg, m.panics)
	m.errors, errs[3] = register(reg, m.errors)
	m.inflight, errs[4] = register(reg, m.inflight)
	m.latency, errs[5] = register(reg, m.latency)
	_, errs[6] = register[prometheus.Collector](reg, &backlogCollector{q: q})
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("queue metrics: %w", err)
	}
	return m, nil
}

// register registers c, or returns the collector already registered in its place: several
// consumers of one process share their metrics.
func register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		if existing, ok := already.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	return c, err
}

// backlogCollector reads each shard's depth (messages waiting or being handled), pending
// (delivered, not yet finished), delayed and dead-lettered counts from Redis on every scrape,
// so that every process reports the same, current figures.
type backlogCollector struct{ q *Queue }

var (
	depthDesc   = prometheus.NewDesc("computeql_queue_depth", "Messages in a shard's stream: waiting or being handled.", []string{"shard"}, nil)
	pendingDesc = prometheus.NewDesc("computeql_queue_pending", "Messages delivered to a consumer and not yet finished.", []string{"shard"}, nil)
	delayedDesc = prometheus.NewDesc("computeql_queue_delayed", "Keys scheduled to run later.", []string{"shard"}, nil)
	deadDesc    = prometheus.NewDesc("computeql_queue_dead_letters", "Dead letters kept.", []string{"shard"}, nil)
)

func (b *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{depthDesc, pendingDesc, delayedDesc, deadDesc} {
		ch <- d
	}
}

// scrapeTimeout keeps a slow Redis from stalling the metrics endpoint.
const scrapeTimeout = 2 * time.Second

func (b *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	backlog, err := b.q.Backlog(ctx)
	if err != nil {
		return // a scrape without the backlog says Redis is away better than zeros would
	}
	for shard, bl := range backlog {
		label := strconv.Itoa(shard)
		for _, m := range []struct {
			desc *prometheus.Desc
			n    int64
		}{{depthDesc, bl.Depth}, {pendingDesc, bl.Pending}, {delayedDesc, bl.Delayed}, {deadDesc, bl.Dead}} {
			ch <- prometheus.MustNewConstMetric(m.desc, prometheus.GaugeValue, float64(m.n), label)
		}
	}
}
