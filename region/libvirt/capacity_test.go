package libvirt_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/virttest"
)

// A host has room for one server of flavor "half" (a little more than half the vCPUs it
// shares out), not two: of two creates at once exactly one is made and the other is
// ErrNoCapacity; a stopped server keeps its room (starting it again must never fail for want
// of it); a deleted one frees it. vCPUs rather than memory: the machine's count of them does
// not change while the test runs.
func TestLibvirtCapacityIsNeverOvercommitted(t *testing.T) {
	kernel, initrd := busybox(t)
	host := virttest.Start(t, virttest.Options{})
	l, err := host.Connect()
	if err != nil {
		t.Fatal(err)
	}
	_, _, cpus, _, _, _, _, _, err := l.NodeGetInfo()
	_ = l.Disconnect()
	if err != nil {
		t.Fatal(err)
	}
	const cpuAllocationRatio = 16 // the driver's
	halfCPUs := int(cpus)*cpuAllocationRatio/2 + 1
	cat := labCatalog(t, host, kernel, initrd, more{flavors: []string{fmt.Sprintf(
		`{"id": "half", "name": "half", "cpus": %d, "memoryGiB": 1, "diskGB": 1, "architecture": "x86_64", "regions": ["lab"]}`, halfCPUs)}})
	d := startDriver(t, cat)
	ctx := context.Background()
	halfSpec := func(name string) region.ServerSpec {
		s := labSpec(name)
		s.FlavorID = "half"
		return s
	}

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		made    []region.Server
		refused []error
	)
	for i := range 2 {
		wg.Go(func() {
			srv, err := d.CreateServer(ctx, halfSpec(fmt.Sprintf("half-%d", i)))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				made = append(made, srv)
			case errors.Is(err, region.ErrNoCapacity):
				refused = append(refused, err)
			default:
				t.Errorf("create: %v", err)
			}
		})
	}
	wg.Wait()
	if len(made) != 1 || len(refused) != 1 {
		t.Fatalf("two creates of flavor half (%d vCPUs) at once on a host of %d CPUs: %d made, %d refused; want one each",
			halfCPUs, cpus, len(made), len(refused))
	}
	srv := made[0]
	t.Cleanup(func() { _ = d.DeleteServer(context.Background(), srv.ID) })
	state := func(id string, want region.ServerState) func() bool {
		return func() bool {
			s, err := d.GetServer(ctx, id)
			return err == nil && s.State == want
		}
	}
	// Its guest need not finish booting (a guest of so many vCPUs takes minutes under TCG on
	// a busy machine): a stop of a guest that does not answer the power button forces it off
	// after the region's stop timeout.
	if _, err := d.StopServer(ctx, srv.ID); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, 2*time.Minute, state(srv.ID, region.ServerStopped), "server STOPPED")
	if _, err := d.CreateServer(ctx, halfSpec("half-while-stopped")); !errors.Is(err, region.ErrNoCapacity) {
		t.Fatalf("create beside a stopped server that holds the room: %v, want ErrNoCapacity", err)
	}

	if err := d.DeleteServer(ctx, srv.ID); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, time.Minute, func() bool {
		_, err := d.GetServer(ctx, srv.ID)
		return errors.Is(err, region.ErrServerNotFound)
	}, "server gone")
	again, err := d.CreateServer(ctx, halfSpec("half-after-delete"))
	if err != nil {
		t.Fatalf("create once the room is free: %v", err)
	}
	if err := d.DeleteServer(ctx, again.ID); err != nil {
		t.Fatal(err)
	}
}
