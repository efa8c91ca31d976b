package worker_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/metrictest"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/region"
)

const (
	sgSSH = "sg-acme-web-eu-ssh"
	sgWeb = "sg-acme-web-eu-web"
)

// A new instance gets a server carrying its tag, and the server's
// power state, health, IPs and MAC are projected onto it once the region runs it.
func TestCreateReachesRunning(t *testing.T) {
	e := newEnv(t)
	plain := e.create(t, "web-1")
	public := e.create(t, "web-2", withPublicIP)
	network, ok := e.cat.Network("net-acme-web-eu")
	if !ok {
		t.Fatal("the demo catalogue has no net-acme-web-eu")
	}
	privateIPs := map[string]string{}
	for _, created := range []*instance.Instance{plain, public} {
		inst := e.waitRunning(t, created.ID)
		srv := e.server(t, inst)
		st := inst.Status
		if srv.State != region.ServerRunning || srv.Tags[region.InstanceTag] != inst.ID {
			t.Errorf("%s: server %s is %s with tags %v, want RUNNING tagged with the instance", inst.Name, srv.ID, srv.State, srv.Tags)
		}
		if st.HealthStatus != instance.HealthHealthy {
			t.Errorf("%s: health %s, want HEALTHY", inst.Name, st.HealthStatus)
		}
		if ip, err := netip.ParseAddr(st.PrivateIP); err != nil || !network.Prefix.Contains(ip) {
			t.Errorf("%s: private IP %q is not in the network's prefix %s", inst.Name, st.PrivateIP, network.Prefix)
		}
		if other, dup := privateIPs[st.PrivateIP]; dup {
			t.Errorf("%s and %s share the private IP %s", inst.Name, other, st.PrivateIP)
		}
		privateIPs[st.PrivateIP] = inst.Name
		if _, err := net.ParseMAC(st.MACAddress); err != nil {
			t.Errorf("%s: MAC %q: %v", inst.Name, st.MACAddress, err)
		}
		wantPublic := created == public
		if _, err := netip.ParseAddr(st.PublicIP); (err == nil) != wantPublic {
			t.Errorf("%s: public IP %q, want one: %v", inst.Name, st.PublicIP, wantPublic)
		}
		if st.PrivateIP != srv.PrivateIP || st.PublicIP != srv.PublicIP || st.MACAddress != srv.MAC {
			t.Errorf("%s: instance shows %s/%s/%s, the server has %s/%s/%s", inst.Name,
				st.PrivateIP, st.PublicIP, st.MACAddress, srv.PrivateIP, srv.PublicIP, srv.MAC)
		}
		if st.ObservedGeneration != 1 || inst.Generation != 1 {
			t.Errorf("%s: observed generation %d of %d, want 1 of 1", inst.Name, st.ObservedGeneration, inst.Generation)
		}
		if c := available(t, inst); c.Status != instance.ConditionTrue || c.Reason != instance.ReasonProvisioned {
			t.Errorf("%s: condition %+v, want Available TRUE Provisioned", inst.Name, c)
		}
	}
}

// Security groups and the public IP change in place: the same server, the same
// MAC, and the new generation is observed once the region applied the change.
func TestNetworkingUpdatesInPlace(t *testing.T) {
	e := newEnv(t)
	created := e.create(t, "web-1", func(r *instance.CreateRequest) {
		r.Networking = &instance.NetworkingRequest{SecurityGroupIDs: []string{sgSSH}}
	})
	before := e.waitRunning(t, created.ID)
	old := e.server(t, before)
	if old.PublicIP != "" || before.Status.PublicIP != "" {
		t.Fatalf("public IP %q/%q before it was asked for", old.PublicIP, before.Status.PublicIP)
	}
	e.wantUsed(t, quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4})

	updated := e.update(t, instance.UpdateRequest{ID: created.ID, Networking: &instance.NetworkingRequest{
		SecurityGroupIDs: []string{sgSSH, sgWeb}, PublicIP: ptr(true),
	}})
	after := e.waitRunning(t, created.ID)
	if after.Status.ObservedGeneration != updated.Generation || updated.Generation != before.Generation+1 {
		t.Errorf("observed generation %d, want the update's %d (one past %d)", after.Status.ObservedGeneration, updated.Generation, before.Generation)
	}
	srv := e.server(t, after)
	if srv.ID != old.ID || srv.MAC != old.MAC || srv.PrivateIP != old.PrivateIP {
		t.Errorf("server %s (MAC %s, IP %s) replaced by %s (MAC %s, IP %s): want an update in place",
			old.ID, old.MAC, old.PrivateIP, srv.ID, srv.MAC, srv.PrivateIP)
	}
	if !slices.Equal(srv.Networking.SecurityGroupIDs, []string{sgSSH, sgWeb}) || !srv.Networking.PublicIP {
		t.Errorf("server networking %+v, want both groups and a public IP", srv.Networking)
	}
	if srv.PublicIP == "" || after.Status.PublicIP != srv.PublicIP {
		t.Errorf("public IP: server %q, instance %q; want the same, set", srv.PublicIP, after.Status.PublicIP)
	}
	if after.Status.MACAddress != old.MAC {
		t.Errorf("instance MAC %s, want the unchanged %s", after.Status.MACAddress, old.MAC)
	}
	e.wantUsed(t, quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4, quota.PublicIPs: 1})
	if n := metrictest.Value(t, e.reg, "computeql_reconcile_rebuilds_total"); n != 0 {
		t.Errorf("%v rebuilds for an in-place change", n)
	}
}

// A flavor change rebuilds the server, which the API refuses without the user's
// consent; with it the worker replaces the server and shows Rebuilding meanwhile.
func TestRebuildOnlyWhenAllowed(t *testing.T) {
	e := newEnv(t, func(s *setup) {
		// Long enough that the test sees the Rebuilding condition.
		s.sim.BuildDelay, s.sim.DeleteDelay = 300*time.Millisecond, 300*time.Millisecond
	})
	created := e.create(t, "web-1")
	before := e.waitRunning(t, created.ID)
	old := e.server(t, before)

	_, err := e.svc.Update(admin, instance.UpdateRequest{ID: created.ID, FlavorID: ptr("g1.medium")})
	var inv *instance.Invalid
	if !errors.As(err, &inv) || !slices.ContainsFunc(inv.Problems, func(p instance.FieldError) bool {
		return p.Code == instance.CodeUnprocessable && slices.Equal(p.Field, []string{"input", "flavorId"})
	}) {
		t.Fatalf("flavor change without allowRebuild: got %v, want UNPROCESSABLE on flavorId", err)
	}
	if got := e.get(t, created.ID); got.Generation != before.Generation || got.FlavorID != "g1.small" {
		t.Errorf("refused update changed the instance: generation %d, flavor %s", got.Generation, got.FlavorID)
	}
	if srv := e.server(t, before); srv.ID != old.ID || srv.FlavorID != "g1.small" || srv.State != region.ServerRunning {
		t.Errorf("refused update touched the server: %+v", srv)
	}

	updated := e.update(t, instance.UpdateRequest{ID: created.ID, FlavorID: ptr("g1.medium"), AllowRebuild: true})
	var rebuilding instance.Condition
	eventually.Holds(t, convergeLimit, func() bool {
		rebuilding = available(t, e.get(t, created.ID))
		return rebuilding.Reason == instance.ReasonRebuilding
	}, "a Rebuilding condition, last %s", eventually.Lazy(func() string { return fmt.Sprintf("%+v", rebuilding) }))
	if rebuilding.Status != instance.ConditionFalse || rebuilding.Message == "" {
		t.Errorf("rebuilding condition %+v, want FALSE with a message", rebuilding)
	}
	// The rebuild lasts until the new server runs: while it builds, the condition still says so.
	var building *instance.Instance
	eventually.Holds(t, convergeLimit, func() bool {
		building = e.get(t, created.ID)
		return building.Status.PowerState == instance.PowerBuilding
	}, "the new server BUILDING, last %s", last(&building))
	if c := available(t, building); c.Reason != instance.ReasonRebuilding {
		t.Errorf("condition while the new server builds: %+v, want Rebuilding", c)
	}
	after := e.waitRunning(t, created.ID)
	srv := e.server(t, after)
	if srv.ID == old.ID || srv.MAC == old.MAC {
		t.Errorf("server %s (MAC %s) kept, want a new one", srv.ID, srv.MAC)
	}
	if srv.FlavorID != "g1.medium" || after.Status.MACAddress != srv.MAC {
		t.Errorf("new server has flavor %s, MAC %s (instance shows %s)", srv.FlavorID, srv.MAC, after.Status.MACAddress)
	}
	if after.Status.ObservedGeneration != updated.Generation {
		t.Errorf("observed generation %d, want %d", after.Status.ObservedGeneration, updated.Generation)
	}
	if c := available(t, after); c.Reason != instance.ReasonProvisioned {
		t.Errorf("condition after the rebuild %+v, want Provisioned", c)
	}
	e.wantUsed(t, quota.Amounts{quota.Servers: 1, quota.CPUs: 4, quota.MemoryGiB: 16})
	if n := metrictest.Value(t, e.reg, "computeql_reconcile_rebuilds_total"); n != 1 {
		t.Errorf("%v rebuilds counted, want 1", n)
	}
}

// The server goes first; only once the region confirms it gone is
// the quota released and the instance forgotten, which frees its name.
func TestDeleteIsOrdered(t *testing.T) {
	e := newEnv(t, func(s *setup) { s.sim.DeleteDelay = 300 * time.Millisecond })
	created := e.create(t, "web-1", withPublicIP)
	inst := e.waitRunning(t, created.ID)
	charge := sum(inst)
	if charge[quota.Servers] != 1 || charge[quota.PublicIPs] != 1 {
		t.Fatalf("charge %v, want a server and a public IP", charge)
	}
	e.wantUsed(t, charge)

	if _, err := e.svc.Delete(admin, created.ID, nil); err != nil {
		t.Fatal(err)
	}
	// Read the usage and the instance, then the servers: whenever a server is still there
	// afterwards, it was there during the reads too, so nothing may have been released.
	sawDeleting := false
	eventually.Holds(t, convergeLimit, func() bool {
		used, cur, srvs := e.used(t), e.lookup(t, created.ID), e.servers(t, inst)
		if len(srvs) == 0 {
			return cur == nil
		}
		if srvs[0].State == region.ServerDeleting {
			sawDeleting = true
		}
		for _, k := range quota.Kinds {
			if used[k] != charge[k] {
				t.Fatalf("%s usage %d while the server is %s, want %d until it is gone", k, used[k], srvs[0].State, charge[k])
			}
		}
		if cur == nil || !cur.Deleting() || cur.Status.ProvisioningStatus != instance.ProvisioningDeprovisioning {
			t.Fatalf("instance while its server is %s: %s, want it DEPROVISIONING", srvs[0].State, statusOf(cur))
		}
		return false
	}, "server gone and instance forgotten")
	if !sawDeleting {
		t.Error("never saw the server DELETING")
	}
	e.wantUsed(t, nil)
	if _, err := e.st.Get(bg, []string{"acme"}, created.ID); !errors.Is(err, instance.ErrNotFound) {
		t.Errorf("get after deprovision: %v, want ErrNotFound", err)
	}

	again := e.create(t, "web-1")
	if again.ID == created.ID {
		t.Fatalf("the new web-1 has the old id %s", again.ID)
	}
	e.waitRunning(t, again.ID)
	e.wantUsed(t, sum(again))
}

// A server that fails to build makes the instance ERROR with the region's message.
func TestFailedBuild(t *testing.T) {
	e := newEnv(t, func(s *setup) { s.sim.Faults.FailBuildPrefix = "fail-" })
	failing := e.create(t, "fail-1")
	healthy := e.create(t, "web-1")
	var inst *instance.Instance
	eventually.Holds(t, convergeLimit, func() bool {
		inst = e.get(t, failing.ID)
		return inst.Status.ProvisioningStatus == instance.ProvisioningError
	}, "fail-1 ERROR, last %s", last(&inst))
	srv := e.server(t, inst)
	if srv.State != region.ServerError || srv.Message == "" {
		t.Fatalf("server %+v, want ERROR with a message", srv)
	}
	if inst.Status.PowerState != instance.PowerError || inst.Status.HealthStatus != instance.HealthError {
		t.Errorf("power %s, health %s, want ERROR and ERROR", inst.Status.PowerState, inst.Status.HealthStatus)
	}
	if c := available(t, inst); c.Status != instance.ConditionFalse || c.Reason != instance.ReasonErrored || c.Message != srv.Message {
		t.Errorf("condition %+v, want FALSE Errored with the region's message %q", c, srv.Message)
	}
	e.waitRunning(t, healthy.ID)
}

// TestNetworkDeletedCascades: deleting a network in the region deletes its
// instances the same way as a user's delete: the server goes first, then the quota and the
// name; an instance on another network is untouched.
func TestNetworkDeletedCascades(t *testing.T) {
	var deleted atomic.Bool
	e := newEnv(t, func(s *setup) {
		cat := s.sim.Catalog
		s.worker.NetworkExists = func(id string) bool {
			_, ok := cat.Network(id)
			return ok && !(deleted.Load() && id == "net-acme-web-eu")
		}
	})
	doomed := e.waitRunning(t, e.create(t, "web-1").ID)
	other := e.waitRunning(t, e.create(t, "web-2", func(r *instance.CreateRequest) { r.NetworkID = "net-acme-web-us" }).ID)

	deleted.Store(true)
	if err := e.q.Enqueue(bg, doomed.Key()); err != nil {
		t.Fatal(err)
	}
	var seen *instance.Instance
	eventually.Holds(t, convergeLimit, func() bool {
		got, err := e.st.Get(bg, []string{"acme"}, doomed.ID)
		if err != nil {
			return false
		}
		seen = got
		return got.Deleting()
	}, "the instance marked deleting, last %s", last(&seen))
	if c := available(t, seen); c.Reason != instance.ReasonDeprovisioning || !strings.Contains(c.Message, "network was deleted") {
		t.Errorf("condition %+v, want Deprovisioning saying the network was deleted", c)
	}
	e.waitGone(t, doomed.ID)
	if srvs := e.servers(t, doomed); len(srvs) != 0 {
		t.Errorf("servers left: %+v", srvs)
	}
	e.wantUsed(t, sum(e.get(t, other.ID)))
	if got := e.get(t, other.ID); got.Deleting() || got.Status.PowerState != instance.PowerRunning {
		t.Errorf("the instance on another network changed: %s", statusOf(got))
	}
}
