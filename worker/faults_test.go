package worker_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/metrictest"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/worker"
)

// When a retried create left two servers carrying the tag, the worker keeps
// the oldest, deletes the others and counts them.
func TestDuplicateServersAreDeleted(t *testing.T) {
	e := newEnv(t, func(s *setup) {
		s.sim.Faults.DuplicateCreates = true
		// The duplicate stays DELETING long enough to be seen next to the one kept.
		s.sim.DeleteDelay = 300 * time.Millisecond
	})
	created := e.create(t, "web-1")
	var kept, dropped region.Server
	eventually.Holds(t, convergeLimit, func() bool {
		srvs := e.servers(t, created)
		if len(srvs) != 2 {
			return false
		}
		d := slices.IndexFunc(srvs, func(s region.Server) bool { return s.State == region.ServerDeleting })
		if d < 0 {
			return false
		}
		dropped, kept = srvs[d], srvs[1-d]
		return true
	}, "two servers, one of them DELETING")
	if kept.State == region.ServerDeleting {
		t.Fatalf("both servers are being deleted: %+v", []region.Server{kept, dropped})
	}
	if !kept.CreatedAt.Before(dropped.CreatedAt) {
		t.Errorf("kept the server created at %s, deleted the one created at %s: want the oldest kept", kept.CreatedAt, dropped.CreatedAt)
	}
	inst := e.waitRunning(t, created.ID)
	eventually.Holds(t, convergeLimit, func() bool { return len(e.servers(t, inst)) == 1 }, "the duplicate gone")
	if srv := e.server(t, inst); srv.ID != kept.ID || inst.Status.MACAddress != kept.MAC {
		t.Errorf("instance on server %s (MAC %s), want the kept %s (MAC %s)", srv.ID, inst.Status.MACAddress, kept.ID, kept.MAC)
	}
	if n := metrictest.Value(t, e.reg, "computeql_reconcile_duplicate_servers_total"); n != 1 {
		t.Errorf("%v duplicate servers counted, want 1", n)
	}
	e.wantUsed(t, sum(inst))
}

// A server deleted behind the worker's back wakes its instance
// through the watcher (the resync is far off), and a new server replaces it. The instance does
// not turn ERROR meanwhile: the server's deletion is not a destructive change anybody made.
func TestServerDeletedBehindOurBackIsRecreated(t *testing.T) {
	rec := &recordingStore{}
	e := newEnv(t, func(s *setup) {
		s.sim.DeleteDelay = 200 * time.Millisecond
		s.store = func(st worker.Store) worker.Store { rec.Store = st; return rec }
	})
	created := e.create(t, "web-1")
	before := e.waitRunning(t, created.ID)
	old := e.server(t, before)
	seen := len(rec.statuses())

	if err := e.probe.DeleteServer(bg, old.ID); err != nil {
		t.Fatal(err)
	}
	var inst *instance.Instance
	eventually.Holds(t, convergeLimit, func() bool {
		inst = e.get(t, created.ID)
		if inst.Status.ProvisioningStatus == instance.ProvisioningError {
			t.Fatalf("instance ERROR while its server was replaced: %s", statusOf(inst))
		}
		srvs := e.servers(t, inst)
		return len(srvs) == 1 && srvs[0].ID != old.ID && converged(inst) && inst.Status.MACAddress == srvs[0].MAC
	}, "a new server RUNNING, last %s", last(&inst))
	if inst.Status.ObservedGeneration != before.Generation {
		t.Errorf("observed generation %d, want %d", inst.Status.ObservedGeneration, before.Generation)
	}
	after := rec.statuses()[seen:]
	if !slices.ContainsFunc(after, func(st instance.Status) bool {
		return slices.ContainsFunc(st.Conditions, func(c instance.Condition) bool { return strings.Contains(c.Message, "recreated") })
	}) {
		t.Errorf("no status said the server was recreated; written: %+v", after)
	}
	for _, st := range after {
		if st.ProvisioningStatus == instance.ProvisioningError {
			t.Errorf("the worker wrote ERROR while replacing the server: %+v", st)
		}
	}
	e.wantUsed(t, sum(inst))
}

// With 30% of region calls failing, every instance still converges to exactly one running
// server with exact quota, and every deletion to nothing at all.
func TestConvergesDespiteRegionErrors(t *testing.T) {
	e := newEnv(t, func(s *setup) {
		s.sim.Faults.ErrorRate = 0.3
		// A key that fails ten times in a row is dead-lettered and shows ERROR; the resync
		// gives it another chance, as it would in production.
		s.worker.ResyncInterval = 100 * time.Millisecond
	})
	var insts []*instance.Instance
	for i := range 20 {
		edit := func(*instance.CreateRequest) {}
		if i%2 == 0 {
			edit = withPublicIP
		}
		insts = append(insts, e.create(t, fmt.Sprintf("web-%d", i), edit))
	}
	for i, created := range insts {
		inst := e.waitRunning(t, created.ID)
		insts[i] = inst
		srv := e.server(t, inst)
		if srv.State != region.ServerRunning || srv.MAC != inst.Status.MACAddress || srv.PublicIP != inst.Status.PublicIP {
			t.Errorf("%s: server %+v does not match the instance's %+v", inst.Name, srv, inst.Status)
		}
	}
	want := sum(insts...)
	if want[quota.Servers] != 20 || want[quota.PublicIPs] != 10 {
		t.Fatalf("charges add up to %v", want)
	}
	e.wantUsed(t, want)
	if n := metrictest.Value(t, e.reg, "computeql_reconcile_total", "outcome", "error"); n == 0 {
		t.Error("no reconcile failed: the faults were not injected")
	}

	for _, inst := range insts {
		if _, err := e.svc.Delete(admin, inst.ID, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, inst := range insts {
		e.waitGone(t, inst.ID)
	}
	for _, inst := range insts {
		if srvs := e.servers(t, inst); len(srvs) != 0 {
			t.Errorf("%s: servers left: %+v", inst.Name, srvs)
		}
	}
	e.wantUsed(t, nil)
}

// A key that keeps failing is dead-lettered, and the dead-letter hook shows the instance ERROR.
func TestDeadLetterMarksInstanceFailed(t *testing.T) {
	e := newEnv(t, func(s *setup) {
		s.queue.MaxDeliveries = 2
		s.sim.Faults.ErrorRate = 1
	})
	created := e.create(t, "web-1")
	var inst *instance.Instance
	eventually.Holds(t, convergeLimit, func() bool {
		inst = e.get(t, created.ID)
		return inst.Status.ProvisioningStatus == instance.ProvisioningError
	}, "instance ERROR, last %s", last(&inst))
	c := available(t, inst)
	if c.Reason != instance.ReasonErrored || !strings.Contains(c.Message, "repeated attempts") {
		t.Errorf("condition %+v, want Errored after repeated attempts", c)
	}
	if strings.Contains(c.Message, "injected") || strings.Contains(c.Message, "unavailable") {
		t.Errorf("internal detail shown to users: %q", c.Message)
	}
	dead, err := e.q.DeadLetters(bg, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(dead, func(d queue.DeadLetter) bool { return d.Key == created.Key() }) {
		t.Errorf("dead letters %+v, want %s", dead, created.Key())
	}
	if srvs := e.servers(t, inst); len(srvs) != 0 {
		t.Errorf("servers created by a region that always fails: %+v", srvs)
	}
}
