package worker_test

import (
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/logtest"
	"github.com/computeql/computeql/metrictest"
)

// TestReconcileIsLoggedAndTimed: every reconcile is one log line naming the instance, its
// organization and the status it reached, and one observation of the reconcile histogram.
func TestReconcileIsLoggedAndTimed(t *testing.T) {
	rec := &logtest.Recorder{}
	e := newEnv(t, func(s *setup) { s.worker.Logger = rec.Logger() })
	inst := e.create(t, "logged")
	e.waitRunning(t, inst.ID)
	var running bool
	eventually.Holds(t, 5*time.Second, func() bool {
		for _, r := range rec.Since(0, "reconcile") {
			if r.Attrs["instance"] == inst.ID && r.Attrs["org"] == inst.OrganizationID && r.Attrs["provisioning"] == "PROVISIONED" && r.Attrs["power"] == "RUNNING" {
				running = true
			}
		}
		return running
	}, "no reconcile log line of %s reaching RUNNING", inst.ID)
	lines := len(rec.Since(0, "reconcile"))
	if got := metrictest.Value(t, e.reg, "computeql_reconcile_duration_seconds"); got < float64(lines) {
		t.Errorf("reconcile histogram has %v observations, fewer than the %d reconciles logged", got, lines)
	}
}
