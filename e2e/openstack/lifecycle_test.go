package openstack

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/openstacktest"
)

// Limits far above what a step takes (the fake driver acts in about a second, the watch
// polls every half second), so that a failure means the step did not happen; a loaded
// two-core machine has taken Nova ten times as long.
const (
	stepLimit = 2 * time.Minute
	pollEvery = 250 * time.Millisecond
)

// TestOpenStackLifecycle follows one instance through its whole life on an OpenStack region,
// as a user drives it through GraphQL and one subscriber sees it, and checks at every step
// what Nova and Neutron really did: the server is ACTIVE on a port of the catalogue's network
// whose address is the instance's, a stop shuts it off, a start and a reboot are Nova's own
// actions, and a delete leaves no server, no port and no quota in use.
//
// A snapshot is refused: the driver makes none, since Nova's fake driver never uploads an
// image, so no snapshot could be tested against this control plane. snapshotInstance answers
// UNPROCESSABLE on the instance, with the region's reason, and Nova records no createImage.
//
// First, on the same control plane (a second would cost another minute), computeql catalog
// import describes the cloud (checkCatalogImport).
func TestOpenStackLifecycle(t *testing.T) {
	cloud := openstacktest.Start(t)
	os := connect(t, cloud)
	step(t, "catalog import describes the cloud", func(t *testing.T) { checkCatalogImport(t, cloud, os) })
	d := deploy(t, cloud, writeCatalog(t, cloud))
	f := d.follow(t)
	clock := newStopwatch(t)
	ctx := context.Background()

	const name = "os-life"
	id := d.create(ctx, t, name)
	clock.step("created %s", id)
	var serverID, ip string

	step(t, "create makes an ACTIVE server on a port of the network", func(t *testing.T) {
		ev := f.until(t, stepLimit, name+" RUNNING", of(id, func(ev event) bool { return ev.Instance.running() }))
		ip = ev.Instance.Status.PrivateIP
		srv := os.server(ctx, t, id)
		serverID = srv.ID
		if srv.Status != "ACTIVE" {
			t.Errorf("Nova's server %s is %s, want ACTIVE", srv.ID, srv.Status)
		}
		if srv.Name != name {
			t.Errorf("Nova's server %s is named %q, want %q", srv.ID, srv.Name, name)
		}
		if srv.Flavor["id"] != cloud.FlavorID {
			t.Errorf("Nova's server %s has flavor %v, want the seeded %s", srv.ID, srv.Flavor["id"], cloud.FlavorID)
		}
		if srv.Image["id"] != cloud.ImageID {
			t.Errorf("Nova's server %s has image %v, want the seeded %s", srv.ID, srv.Image["id"], cloud.ImageID)
		}
		ports := os.ports(ctx, t, srv.ID)
		if len(ports) != 1 {
			t.Fatalf("server %s has %d ports, want 1: %+v", srv.ID, len(ports), ports)
		}
		p := ports[0]
		if p.NetworkID != cloud.NetworkID {
			t.Errorf("port %s is on network %s, want the catalogue's %s", p.ID, p.NetworkID, cloud.NetworkID)
		}
		if len(p.FixedIPs) != 1 || p.FixedIPs[0].IPAddress != ip || p.FixedIPs[0].SubnetID != cloud.SubnetID {
			t.Errorf("port %s has addresses %+v; the instance says %s in subnet %s", p.ID, p.FixedIPs, ip, cloud.SubnetID)
		}
		if !strings.EqualFold(p.MACAddress, ev.Instance.Status.MACAddress) {
			t.Errorf("port %s has MAC %s; the instance says %s", p.ID, p.MACAddress, ev.Instance.Status.MACAddress)
		}
		clock.step("RUNNING at %s: Nova server %s ACTIVE, port %s", ip, srv.ID, p.ID)
	})

	step(t, "a snapshot is refused as unsupported", func(t *testing.T) {
		errs := d.verb(ctx, t, "snapshotInstance", map[string]any{"id": id, "name": "os-life-image"})
		if len(errs) != 1 || errs[0].Code != "UNPROCESSABLE" || !slices.Equal(errs[0].Field, []string{"input", "id"}) ||
			!strings.Contains(errs[0].Message, "makes no snapshots") {
			t.Fatalf("snapshotInstance: userErrors %+v, want one UNPROCESSABLE on input.id saying the region makes no snapshots", errs)
		}
		if acts := os.actions(ctx, t, serverID); slices.Contains(acts, "createImage") {
			t.Errorf("Nova's actions on server %s: %v, with a createImage", serverID, acts)
		}
		clock.step("snapshotInstance refused: %s", errs[0].Message)
	})

	step(t, "stop shuts the server off", func(t *testing.T) {
		d.mustVerb(ctx, t, "stopInstance", id)
		f.until(t, stepLimit, "the STOP action", of(id, action("STOP")))
		f.until(t, stepLimit, name+" STOPPED", of(id, func(ev event) bool { return ev.Instance.Status.PowerState == "STOPPED" }))
		if srv := os.server(ctx, t, id); srv.ID != serverID || srv.Status != "SHUTOFF" {
			t.Errorf("Nova's server of %s: %s %s, want %s SHUTOFF", id, srv.ID, srv.Status, serverID)
		}
		lastAction(ctx, t, os, serverID, "stop")
		clock.step("STOPPED; Nova's server SHUTOFF")
	})

	step(t, "start powers it on again", func(t *testing.T) {
		d.mustVerb(ctx, t, "startInstance", id)
		f.until(t, stepLimit, "the START action", of(id, action("START")))
		ev := f.until(t, stepLimit, name+" RUNNING again", of(id, func(ev event) bool { return ev.Instance.running() }))
		if got := ev.Instance.Status.PrivateIP; got != ip {
			t.Errorf("after a start: IP %s, want the same port's %s", got, ip)
		}
		if srv := os.server(ctx, t, id); srv.ID != serverID || srv.Status != "ACTIVE" {
			t.Errorf("Nova's server of %s: %s %s, want %s ACTIVE", id, srv.ID, srv.Status, serverID)
		}
		lastAction(ctx, t, os, serverID, "start")
		clock.step("RUNNING again; Nova's server ACTIVE")
	})

	step(t, "reboot is Nova's reboot", func(t *testing.T) {
		d.mustVerb(ctx, t, "rebootInstance", id)
		f.until(t, stepLimit, "the REBOOT action", of(id, action("REBOOT")))
		// The fake driver reboots at once: the watch may never see the server other than
		// ACTIVE, and then no event follows the action. Nova's record of the action is the
		// proof that it happened, and the instance must be RUNNING, which is polled for.
		lastAction(ctx, t, os, serverID, "reboot")
		await(t, stepLimit, "the instance RUNNING and Nova's server ACTIVE after the reboot", func() error {
			if inst := d.get(ctx, t, id); !inst.running() || inst.Status.PrivateIP != ip {
				return errors.New(inst.String())
			}
			if srv := os.server(ctx, t, id); srv.Status != "ACTIVE" {
				return errors.New("Nova's server is " + srv.Status)
			}
			return nil
		})
		clock.step("rebooted: RUNNING, Nova's server ACTIVE")
	})

	step(t, "delete leaves nothing in the cloud", func(t *testing.T) {
		d.mustVerb(ctx, t, "deleteInstance", id)
		f.until(t, stepLimit, name+" DELETED", of(id, func(ev event) bool { return ev.Kind == "DELETED" }))
		if list := os.servers(ctx, t, id); len(list) > 0 {
			t.Errorf("Nova still lists %d servers of %s: %s %s", len(list), id, list[0].ID, list[0].Status)
		}
		if ports := os.ports(ctx, t, serverID); len(ports) > 0 {
			t.Errorf("ports of server %s left in Neutron: %+v", serverID, ports)
		}
		q, err := d.client.Quota(ctx, org)
		if err != nil {
			t.Fatal(err)
		}
		for kind, used := range q.Used {
			if used != 0 {
				t.Errorf("quota %s: %d in use after the delete, want 0", kind, used)
			}
		}
		clock.step("DELETED; no server or port left")
	})
}

// lastAction checks that Nova's latest action on the server is want: the verb reached Nova.
func lastAction(ctx context.Context, t *testing.T, n *nova, serverID, want string) {
	t.Helper()
	acts := n.actions(ctx, t, serverID)
	if len(acts) == 0 || acts[len(acts)-1] != want {
		t.Errorf("Nova's actions on server %s: %v, want the last to be %s", serverID, acts, want)
	}
}

// await polls cond every pollEvery until it returns nil, failing the test with cond's last
// error after limit: for what no event tells.
func await(t *testing.T, limit time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not within %s: last: %v", what, limit, err)
		}
		<-tick.C
	}
}
