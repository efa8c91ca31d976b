package libvirt_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/libvirt"
	"github.com/computeql/computeql/virttest"
)

// A region of two hosts (two libvirtd in two namespaces): servers spread over them, with
// addresses of their network unique across both; a flavor too big for either is ErrNoCapacity
// naming the region and the flavor; while a host's daemon is stopped, its servers' instances
// are ErrUnreachable naming it — also to a process that never reached it — and nothing is
// taken to be gone; once it is back they are found as they were; and an instance whose server
// was deleted is no longer one the host may hold. A host that hangs is cut, and creates go on
// on the other.
func TestLibvirtHosts(t *testing.T) {
	kernel, initrd := busybox(t)
	racks := []*virttest.Host{virttest.Start(t, virttest.Options{}), virttest.Start(t, virttest.Options{})}
	cat := labCatalog(t, racks[0], kernel, initrd, more{hosts: racks})
	rdb := redisServer.Client(t)
	// The driver's clock, which the test moves on past the time during which a delete leaves
	// an instance recorded on its host (another process may be making a server of it).
	var skew atomic.Int64
	d := runDriverWith(t, cat, rdb, func(o *libvirt.Options) {
		o.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	})
	ctx := context.Background()

	a, err := d.CreateServer(ctx, labSpec("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.CreateServer(ctx, labSpec("b"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.DeleteServer(context.Background(), a.ID)
		_ = d.DeleteServer(context.Background(), b.ID)
	})
	holds := func(rack int, id string) bool {
		t.Helper()
		l, err := racks[rack].Connect()
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Disconnect() }()
		_, err = l.DomainLookupByName("computeql-" + id)
		return err == nil
	}
	rackOf := func(id string) int {
		t.Helper()
		at := -1
		for i := range racks {
			if holds(i, id) {
				at = i
			}
		}
		return at
	}
	ra, rb := rackOf(a.ID), rackOf(b.ID)
	if ra < 0 || rb < 0 || ra == rb {
		t.Fatalf("servers on racks %d and %d (0-based, -1: none), want one on each: the second goes to the host with more free memory", ra, rb)
	}
	running := func(id string) region.Server {
		t.Helper()
		var srv region.Server
		eventually.Holds(t, 3*time.Minute, func() bool {
			srv, err = d.GetServer(ctx, id)
			return err == nil && srv.State == region.ServerRunning
		}, "server %s RUNNING", id)
		return srv
	}
	a, b = running(a.ID), running(b.ID)
	if a.PrivateIP == "" || a.PrivateIP == b.PrivateIP {
		t.Errorf("servers of one network on two hosts have addresses %q and %q, want two", a.PrivateIP, b.PrivateIP)
	}

	huge := labSpec("huge")
	huge.FlavorID = "huge"
	_, err = d.CreateServer(ctx, huge)
	if !errors.Is(err, region.ErrNoCapacity) || !strings.Contains(err.Error(), "no host of region lab has room for flavor huge") {
		t.Errorf("create of a flavor too big for either host: %v, want ErrNoCapacity naming the region and the flavor", err)
	}

	awayRack, away, stays := racks[rb], b, a
	awayName := "rack" + string(rune('1'+rb))
	find := func(d *libvirt.Driver, srv region.Server) ([]region.Server, error) {
		return d.FindServers(ctx, srv.Scope, region.InstanceTag, srv.Tags[region.InstanceTag])
	}
	hostAway := func(d *libvirt.Driver) func() bool {
		return func() bool {
			var host region.HostUnreachable
			_, err := find(d, away)
			return errors.As(err, &host) && host.Host == awayName && host.Region == "lab"
		}
	}
	if err := awayRack.StopDaemon(); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, 30*time.Second, hostAway(d), "the instance of the server on the stopped host is unreachable, naming %s", awayName)
	if got, err := find(d, stays); err != nil || len(got) != 1 || got[0].ID != stays.ID {
		t.Errorf("find the server on the host still up: %v, %v; want it", ids(got), err)
	}
	if got, err := d.FindServers(ctx, stays.Scope, region.InstanceTag, "never-made"); err != nil || len(got) != 0 {
		t.Errorf("find an instance no host was given: %v, %v; want none, no error", ids(got), err)
	}
	if _, err := d.GetServer(ctx, away.ID); !errors.Is(err, region.ErrUnreachable) {
		t.Errorf("get the server on the stopped host: %v, want ErrUnreachable", err)
	}
	if err := d.DeleteServer(ctx, away.ID); !errors.Is(err, region.ErrUnreachable) {
		t.Errorf("delete the server on the stopped host: %v, want ErrUnreachable (it may still be there)", err)
	}

	// A process that starts while the host is away has never seen its servers: the host's
	// set of instances in Redis says that one may be there.
	lab, _ := cat.Region("lab")
	fresh, err := libvirt.New(libvirt.Options{Region: *lab, Catalog: cat, Redis: rdb, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	freshCtx, stopFresh := context.WithCancel(ctx)
	freshDone := make(chan error, 1)
	go func() { freshDone <- fresh.Run(freshCtx) }()
	t.Cleanup(func() { stopFresh(); <-freshDone })
	eventually.Holds(t, 30*time.Second, func() bool {
		got, err := find(fresh, stays)
		return err == nil && len(got) == 1
	}, "a new process finds the server on the host that is up")
	if !hostAway(fresh)() {
		_, err := find(fresh, away)
		t.Errorf("a new process finds the instance on the stopped host: %v; want HostUnreachable naming %s", err, awayName)
	}

	if err := awayRack.StartDaemon(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*libvirt.Driver{d, fresh} {
		eventually.Holds(t, 30*time.Second, func() bool {
			got, err := find(p, away)
			return err == nil && len(got) == 1 && got[0].ID == away.ID && got[0].State == region.ServerRunning
		}, "the server on the host that came back is found RUNNING")
	}

	// A host that hangs (its daemon frozen, the connection open) is cut by the heartbeat: a
	// create meanwhile goes to the other host, and the instance of the hung host's server says
	// its host cannot be reached.
	stayRack, stayName := racks[ra], "rack"+string(rune('1'+ra))
	if err := stayRack.Freeze(); err != nil {
		t.Fatal(err)
	}
	c, err := d.CreateServer(ctx, labSpec("c"))
	if err != nil {
		t.Fatalf("create while a host hangs: %v", err)
	}
	t.Cleanup(func() { _ = d.DeleteServer(context.Background(), c.ID) })
	if !holds(rb, c.ID) {
		t.Errorf("a server made while rack%d hangs is not on rack%d", ra+1, rb+1)
	}
	eventually.Holds(t, 30*time.Second, func() bool {
		var host region.HostUnreachable
		_, err := find(d, stays)
		return errors.As(err, &host) && host.Host == stayName
	}, "the instance on the hung host is unreachable, naming %s", stayName)
	if err := stayRack.Thaw(); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, 30*time.Second, func() bool {
		got, err := find(d, stays)
		return err == nil && len(got) == 1 && got[0].State == region.ServerRunning
	}, "the server on the host that hung is found RUNNING once it answers again")
	if err := d.DeleteServer(ctx, c.ID); err != nil {
		t.Fatal(err)
	}

	skew.Store(int64(time.Minute))
	if err := d.DeleteServer(ctx, away.ID); err != nil {
		t.Fatal(err)
	}
	if err := awayRack.StopDaemon(); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, 30*time.Second, func() bool { return !d.Connected() }, "the driver sees the host go")
	if got, err := find(d, away); err != nil || len(got) != 0 {
		t.Errorf("find the instance whose server was deleted, its host away: %v, %v; want none, no error", ids(got), err)
	}
	if err := awayRack.StartDaemon(ctx); err != nil {
		t.Fatal(err)
	}
}

func ids(servers []region.Server) []string {
	out := make([]string, len(servers))
	for i, s := range servers {
		out[i] = s.ID
	}
	return out
}
