package openstack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gorilla/websocket"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/openstacktest"
	"github.com/computeql/computeql/virttest"
)

// Limits far above what a step takes (Nova makes a server ACTIVE in seconds, the guest boots
// in a minute or so under software emulation, the watch polls every half second), so that a
// failure means the step did not happen; a loaded two-core machine has taken Nova ten times
// as long.
const (
	stepLimit = 3 * time.Minute
	pollEvery = 250 * time.Millisecond
)

// TestOpenStackLifecycle follows one instance through its whole life on an OpenStack region
// whose compute is Nova's libvirt driver, booting a real guest (QEMU under software emulation,
// the busybox image) on a private libvirtd, as a user drives it through GraphQL and one
// subscriber sees it, and checks at every step what Nova, Neutron and Glance really did: the
// server is ACTIVE on a port of the catalogue's network whose address is the instance's, the
// guest's boot shows in instanceConsoleOutput (Nova's console log), console sessions are its
// serial console (Nova's serial console proxy), a snapshot is a READY
// Glance image of the project that deleteImage removes, a stop shuts the server off, a start
// and a reboot are Nova's own actions, and a delete leaves no server, no port and no quota in
// use.
//
// First, on the same control plane (a second would cost another minute), computeql catalog
// import describes the cloud (checkCatalogImport).
func TestOpenStackLifecycle(t *testing.T) {
	virttest.Require(t)
	kernel, initrd := openstacktest.GuestImages(t)
	host := virttest.Start(t, virttest.Options{HostNetwork: true})
	cloud := openstacktest.Start(t, openstacktest.Options{Libvirt: &openstacktest.Libvirt{URI: host.URI, Kernel: kernel, Initrd: initrd}})
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

	step(t, "the guest's boot shows on its console", func(t *testing.T) {
		await(t, stepLimit, "the guest's ready line in instanceConsoleOutput", func() error {
			out := d.consoleOutput(ctx, t, id)
			if !strings.Contains(out, guestReady) {
				return fmt.Errorf("%d bytes of console, no %q yet", len(out), guestReady)
			}
			return nil
		})
		clock.step("the guest booted: %q on its console", guestReady)
	})

	step(t, "a console session is the guest's serial console", func(t *testing.T) {
		first := d.openConsole(ctx, t, id)
		defer first.Close()
		typeAndRead(t, first, "typed-first-"+id)
		// QEMU serves a serial port to one client: a second session takes the console, and
		// the first one ends.
		second := d.openConsole(ctx, t, id)
		defer second.Close()
		first.SetReadDeadline(time.Now().Add(stepLimit))
		for {
			if _, _, err := first.ReadMessage(); err != nil {
				var ce *websocket.CloseError
				if !errors.As(err, &ce) {
					t.Errorf("the first session ended with %v, want a close frame", err)
				}
				break
			}
		}
		typeAndRead(t, second, "typed-second-"+id)
		clock.step("console sessions echoed what was typed; the second took the console from the first")
	})

	step(t, "a snapshot is a Glance image of the project", func(t *testing.T) {
		img := d.snapshot(ctx, t, id, name+"-image")
		if img.State != "CREATING" {
			t.Fatalf("snapshotInstance: image %+v, want it CREATING", img)
		}
		lastAction(ctx, t, os, serverID, "createImage")
		await(t, stepLimit, "snapshot "+img.ID+" READY", func() error {
			for _, im := range d.images(ctx, t) {
				if im.ID == img.ID {
					if im.State != "READY" {
						return fmt.Errorf("it is %s", im.State)
					}
					return nil
				}
			}
			return errors.New("not listed")
		})
		g := os.glanceImage(ctx, t, img.ID)
		if g.Status != "active" || g.SizeBytes == 0 || g.Properties["compute:org"] != org || g.Properties["compute:project"] != project ||
			g.Properties["kernel_id"] != cloud.KernelImageID {
			t.Errorf("Glance's image %s: %s, %d bytes, properties %v; want active, the disk's bytes, of %s/%s, booting the guest's kernel %s",
				g.ID, g.Status, g.SizeBytes, g.Properties, org, project, cloud.KernelImageID)
		}
		if inst := d.get(ctx, t, id); !inst.running() {
			t.Errorf("after the snapshot the instance is %s, want RUNNING", inst)
		}
		if errs := d.verb(ctx, t, "deleteImage", map[string]any{"id": img.ID}); len(errs) > 0 {
			t.Fatalf("deleteImage %s: userErrors %+v", img.ID, errs)
		}
		if os.imageExists(ctx, t, img.ID) {
			t.Errorf("Glance still has image %s after deleteImage", img.ID)
		}
		clock.step("snapshot %s READY in Glance, then deleted", img.ID)
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
		// A soft reboot may be over between two polls of the watch, which then never sees the
		// server other than ACTIVE, and no event follows the action. Nova's record of the
		// action is the proof that it happened, and the instance must be RUNNING, which is
		// polled for.
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
		// The instance is DELETED once Nova shows its server DELETED, which Nova still lists
		// until it forgets the server's row a moment later.
		var left []servers.Server
		eventually.Holds(t, stepLimit, func() bool {
			left = os.servers(ctx, t, id)
			return len(left) == 0
		}, "Nova lists no server of %s; it lists %v", id, eventually.Lazy(func() string {
			var seen []string
			for _, s := range left {
				seen = append(seen, s.ID+" "+s.Status)
			}
			return strings.Join(seen, ", ")
		}))
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
