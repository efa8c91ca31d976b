package worker

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/region"
)

// Metrics are the worker's counts.
type Metrics struct {
	outcomes     *prometheus.CounterVec
	duplicates   prometheus.Counter
	rebuilds     prometheus.Counter
	resizes      prometheus.Counter
	orphanEvents *prometheus.CounterVec
	// orphansDeleted counts servers deleted because their instance does not exist.
	orphansDeleted prometheus.Counter
	resyncQueued   prometheus.Counter
	duration       prometheus.Histogram
	instances      *prometheus.GaugeVec
}

// NewMetrics registers the worker's metrics with reg (none when reg is nil).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "computeql_reconcile_total", Help: "Reconciles by outcome (ok, error, or unreachable: the region's host could not be reached).",
		}, []string{"outcome"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "computeql_reconcile_duplicate_servers_total", Help: "Extra servers found for one instance and deleted.",
		}),
		resizes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "computeql_reconcile_resizes_total", Help: "Servers given a new flavor in place.",
		}),
		rebuilds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "computeql_reconcile_rebuilds_total", Help: "Servers deleted to be rebuilt for a destructive change.",
		}),
		orphanEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "computeql_region_orphan_events_total", Help: "Region server events whose owner could not be found, by reason (untagged, unknown instance).",
		}, []string{"reason"}),
		orphansDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "computeql_region_orphan_servers_deleted_total", Help: "Servers deleted by the collection of orphans because their instance does not exist.",
		}),
		resyncQueued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "computeql_resync_enqueued_total", Help: "Instances the periodic resync put back on the queue.",
		}),
		instances: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "computeql_instances",
			Help: "Instances by organization and provisioning status, as the last resync pass of this worker read them (every resync interval, 30s by default).",
		}, []string{"organization", "provisioning"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "computeql_reconcile_duration_seconds", Help: "Time one reconcile takes, region calls included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 14),
		}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.outcomes, m.duplicates, m.rebuilds, m.resizes, m.orphanEvents, m.orphansDeleted, m.resyncQueued, m.duration, m.instances} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}

func (m *Metrics) reconciled(err error, took time.Duration) {
	m.duration.Observe(took.Seconds())
	outcome := "ok"
	switch {
	case errors.Is(err, region.ErrUnreachable):
		outcome = "unreachable"
	case err != nil:
		outcome = "error"
	}
	m.outcomes.WithLabelValues(outcome).Inc()
}

// provisioningStatuses are the gauge's label values: every one is set, zeros included, so
// that an instance leaving a status takes the series to 0 rather than leaving it stale.
var provisioningStatuses = []instance.ProvisioningStatus{
	instance.ProvisioningPending, instance.ProvisioningProvisioning, instance.ProvisioningProvisioned,
	instance.ProvisioningDeprovisioning, instance.ProvisioningError,
}

func (m *Metrics) countInstances(org string, counts map[instance.ProvisioningStatus]int) {
	for _, st := range provisioningStatuses {
		m.instances.WithLabelValues(org, string(st)).Set(float64(counts[st]))
	}
}
