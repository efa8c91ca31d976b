package worker_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/worker"
)

// eventsOnly configures a worker that only the region's events can wake about a settled
// instance: no resync comes during a test, and a settled instance is not polled.
func eventsOnly(s *setup) { s.worker.ResyncInterval = time.Hour }

// powers renders the power states of the statuses for failure messages.
func powers(statuses []instance.Status) string {
	out := make([]instance.PowerState, len(statuses))
	for i, s := range statuses {
		out[i] = s.PowerState
	}
	return fmt.Sprint(out)
}

// Power changes made in the region (stop, start, soft and hard reboot)
// reach the instance through the region's events: its power state follows the server's,
// through the transitional state (PowerDelay is long enough for the worker to see it), while
// it stays PROVISIONED on the same server with its generation still observed.
func TestPowerChangesInTheRegionReachTheInstance(t *testing.T) {
	const powerDelay = 300 * time.Millisecond
	rec := &recordingStore{}
	e := newEnv(t, eventsOnly, func(s *setup) {
		s.sim.PowerDelay = powerDelay
		s.store = func(st worker.Store) worker.Store { rec.Store = st; return rec }
	})
	before := e.waitRunning(t, e.create(t, "web-1", withPublicIP).ID)
	srv := e.server(t, before)

	steps := []struct {
		name         string
		act          func(ctx context.Context, id string) (region.Server, error)
		transitional instance.PowerState
		want         instance.PowerState
		wantServer   region.ServerState
	}{
		{"stop", e.probe.StopServer, instance.PowerStopping, instance.PowerStopped, region.ServerStopped},
		{"start", e.probe.StartServer, instance.PowerPending, instance.PowerRunning, region.ServerRunning},
		{"soft reboot", func(ctx context.Context, id string) (region.Server, error) {
			return e.probe.RebootServer(ctx, id, false)
		}, instance.PowerPending, instance.PowerRunning, region.ServerRunning},
		{"hard reboot", func(ctx context.Context, id string) (region.Server, error) {
			return e.probe.RebootServer(ctx, id, true)
		}, instance.PowerPending, instance.PowerRunning, region.ServerRunning},
	}
	for _, st := range steps {
		ok := t.Run(st.name, func(t *testing.T) {
			seen := len(rec.statuses())
			if _, err := st.act(bg, srv.ID); err != nil {
				t.Fatalf("%s the server in the region: %v", st.name, err)
			}
			// The worker must have written the transitional power state and then the settled
			// one: for a reboot, the settled state is the one it started from.
			var inst *instance.Instance
			eventually.Holds(t, convergeLimit, func() bool {
				written := rec.statuses()[seen:]
				inst = e.get(t, before.ID)
				i := slices.IndexFunc(written, func(s instance.Status) bool { return s.PowerState == st.transitional })
				return i >= 0 &&
					slices.ContainsFunc(written[i+1:], func(s instance.Status) bool { return s.PowerState == st.want }) &&
					inst.Status.PowerState == st.want
			}, "power %s, then %s; last %s; written since: %s", st.transitional, st.want, last(&inst),
				eventually.Lazy(func() string { return powers(rec.statuses()[seen:]) }))

			now := e.server(t, inst)
			if now.ID != srv.ID || now.State != st.wantServer {
				t.Errorf("server %s is %s, want the same server %s %s", now.ID, now.State, srv.ID, st.wantServer)
			}
			got := inst.Status
			if got.ProvisioningStatus != instance.ProvisioningProvisioned || inst.Generation != before.Generation ||
				got.ObservedGeneration != before.Generation {
				t.Errorf("status %s, want PROVISIONED with generation %d observed", statusOf(inst), before.Generation)
			}
			if got.PrivateIP != before.Status.PrivateIP || got.PublicIP != before.Status.PublicIP || got.MACAddress != before.Status.MACAddress {
				t.Errorf("addresses %s/%s/%s, want the server's unchanged %s/%s/%s", got.PrivateIP, got.PublicIP, got.MACAddress,
					before.Status.PrivateIP, before.Status.PublicIP, before.Status.MACAddress)
			}
			if c := available(t, inst); c.Reason != instance.ReasonProvisioned {
				t.Errorf("condition %+v, want reason %s", c, instance.ReasonProvisioned)
			}
			// Nothing written along the way took the instance for unprovisioned or failed.
			for _, s := range rec.statuses()[seen:] {
				if s.ProvisioningStatus != instance.ProvisioningProvisioned || s.ObservedGeneration != before.Generation {
					t.Errorf("the worker wrote %+v during %s, want PROVISIONED with generation %d observed", s, st.name, before.Generation)
				}
			}
		})
		if !ok {
			break // the steps build on each other
		}
	}
}

// The health the region reports for a server reaches its instance through the
// region's events, whatever it is, without touching its power or provisioning.
func TestHealthChangesInTheRegionReachTheInstance(t *testing.T) {
	e := newEnv(t, eventsOnly)
	before := e.waitRunning(t, e.create(t, "web-1").ID)
	if before.Status.HealthStatus != instance.HealthHealthy {
		t.Fatalf("a running instance is %s, want HEALTHY", before.Status.HealthStatus)
	}
	srv := e.server(t, before)
	steps := []struct {
		set  region.ServerHealth
		want instance.HealthStatus
	}{
		{region.HealthDegraded, instance.HealthDegraded},
		{region.HealthError, instance.HealthError},
		{region.HealthHealthy, instance.HealthHealthy},
	}
	for _, st := range steps {
		if err := e.probe.SetHealth(bg, srv.ID, st.set); err != nil {
			t.Fatalf("SetHealth %s: %v", st.set, err)
		}
		var inst *instance.Instance
		eventually.Holds(t, convergeLimit, func() bool {
			inst = e.get(t, before.ID)
			return inst.Status.HealthStatus == st.want
		}, "health %s, last %s", st.want, last(&inst))
		if !converged(inst) || inst.Status.ObservedGeneration != before.Generation {
			t.Errorf("with health %s the instance is %s, want RUNNING and PROVISIONED with generation %d observed",
				st.want, statusOf(inst), before.Generation)
		}
	}
}
