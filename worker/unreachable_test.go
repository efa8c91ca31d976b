package worker_test

import (
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/metrictest"
	"github.com/computeql/computeql/region"
)

// A region whose host cannot be reached is waited out, however long: its instances keep what
// was last known and say why their health is unknown, no key is dead-lettered and nothing is
// decided (no ERROR, no deletion, no recreation) from the host's silence; verbs answer
// UNAVAILABLE and change nothing. When the host is back, reconciling resumes where it was.
func TestUnreachableRegionIsWaitedOut(t *testing.T) {
	const maxDeliveries = 2
	e := newEnv(t, func(s *setup) {
		// Were the outage counted as failures, each key would be dead-lettered (and shown
		// ERROR) after two of them; the resync puts every instance back on the queue often.
		s.queue.MaxDeliveries = maxDeliveries
		s.worker.UnreachableRetry = 20 * time.Millisecond
		s.worker.ResyncInterval = 50 * time.Millisecond
	})
	running := e.waitRunning(t, e.create(t, "web-1").ID)
	leaving := e.waitRunning(t, e.create(t, "web-2").ID)
	before := running.Status

	e.region.SetUnreachable(true)
	if _, err := e.svc.Stop(operator, running.ID, nil); instance.CodeOf(err) != instance.CodeUnavailable {
		t.Fatalf("stop while the host is unreachable: %v, want UNAVAILABLE", err)
	}
	if _, err := e.svc.Delete(admin, leaving.ID, nil); err != nil {
		t.Fatal(err)
	}
	waiting := e.create(t, "web-3")

	for _, id := range []string{running.ID, leaving.ID, waiting.ID} {
		var inst *instance.Instance
		eventually.Holds(t, convergeLimit, func() bool {
			inst = e.get(t, id)
			return available(t, inst).Reason == instance.ReasonRegionUnreachable
		}, "instance %s says its region is unreachable, last %s", id, last(&inst))
		if c := available(t, inst); c.Status != instance.ConditionUnknown || c.Message != "The host of region "+inst.RegionID+
			" cannot be reached. The last known state is shown; reconciling resumes when the host is back." {
			t.Errorf("%s: condition %+v", inst.Name, c)
		}
	}
	// Many more deliveries than dead-lettering allows for a failing key.
	eventually.Holds(t, convergeLimit, func() bool {
		return metrictest.Value(t, e.reg, "computeql_reconcile_total", "outcome", "unreachable") >= 10*maxDeliveries
	}, "reconciles met the outage")
	if n := metrictest.Value(t, e.reg, "computeql_reconcile_total", "outcome", "error"); n != 0 {
		t.Errorf("%v reconciles counted as errors during the outage, want 0", n)
	}
	if dead, err := e.q.DeadLetters(bg, 10); err != nil || len(dead) != 0 {
		t.Fatalf("dead letters during the outage: %+v, %v", dead, err)
	}
	inst := e.get(t, running.ID)
	if st := inst.Status; st.ProvisioningStatus != before.ProvisioningStatus || st.PowerState != before.PowerState ||
		st.PrivateIP != before.PrivateIP || st.MACAddress != before.MACAddress || st.HealthStatus != instance.HealthUnknown {
		t.Errorf("status during the outage %+v, want the last known one %+v with health UNKNOWN", st, before)
	}
	if st := e.get(t, leaving.ID).Status.ProvisioningStatus; st != instance.ProvisioningDeprovisioning {
		t.Errorf("deleted instance %s during the outage, want it still deprovisioning", st)
	}
	if st := e.get(t, waiting.ID).Status; st.ProvisioningStatus == instance.ProvisioningError {
		t.Errorf("instance created during the outage shows %+v", st)
	}
	if srvs, err := e.probe.FindServers(bg, running.Scope(), region.InstanceTag, running.ID); err != nil || len(srvs) != 1 || srvs[0].State != region.ServerRunning {
		t.Fatalf("servers during the outage: %+v, %v; want the one RUNNING server untouched", srvs, err)
	}

	e.region.SetUnreachable(false)
	for _, id := range []string{running.ID, waiting.ID} {
		var inst *instance.Instance
		eventually.Holds(t, convergeLimit, func() bool {
			inst = e.get(t, id)
			c := available(t, inst)
			return converged(inst) && c.Reason == instance.ReasonProvisioned && c.Status == instance.ConditionTrue
		}, "instance %s RUNNING and available after the outage, last %s", id, last(&inst))
	}
	if srv := e.server(t, running); srv.MAC != before.MACAddress {
		t.Errorf("server after the outage has MAC %s, want the same server (MAC %s)", srv.MAC, before.MACAddress)
	}
	e.waitGone(t, leaving.ID)
	e.wantUsed(t, sum(e.get(t, running.ID), e.get(t, waiting.ID)))
}
