package worker

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the worker's counts.
type Metrics struct {
	outcomes     *prometheus.CounterVec
	duplicates   prometheus.Counter
	rebuilds     prometheus.Counter
	orphanEvents *prometheus.CounterVec
	resyncQueued prometheus.Counter
	duration     prometheus.Histogram
}

// NewMetrics registers the worker's metrics with reg (none when reg is nil).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "computeql_reconcile_total", Help: "Reconciles by outcome (ok or error).",
		}, []string{"outcome"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "computeql_reconcile_duplicate_servers_total", Help: "Extra servers found for one instance and deleted.",
		}),
		rebuilds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "computeql_reconcile_rebuilds_total", Help: "Servers deleted to be rebuilt for a destructive change.",
		}),
		orphanEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "computeql_region_orphan_events_total", Help: "Region server events whose owner could not be found, by reason (untagged, unknown instance).",
		}, []string{"reason"}),
		resyncQueued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "computeql_resync_enqueued_total", Help: "Instances the periodic resync put back on the queue.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "computeql_reconcile_duration_seconds", Help: "Time one reconcile takes, region calls included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 14),
		}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.outcomes, m.duplicates, m.rebuilds, m.orphanEvents, m.resyncQueued, m.duration} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}

func (m *Metrics) reconciled(err error, took time.Duration) {
	m.duration.Observe(took.Seconds())
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.outcomes.WithLabelValues(outcome).Inc()
}
