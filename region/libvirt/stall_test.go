package libvirt_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/virttest"
)

// A guest that never takes its address (here it boots into a shell instead of its init, so no
// DHCP client runs) is not left BUILDING for ever: past the region's buildTimeout the server
// is ERROR and says why, and a watcher hears of it. The domain is left running, so that the
// guest may still come up; a delete frees it as any other.
func TestLibvirtStalledBuildIsError(t *testing.T) {
	kernel, initrd := busybox(t)
	host := virttest.Start(t, virttest.Options{})
	cat := labCatalog(t, host, kernel, initrd, more{buildTimeout: "15s", images: []string{`{"id": "stuck", "name": "stuck",
		"architecture": "x86_64", "sizeGiB": 1, "virtualization": "virtualized", "state": "ready", "regions": ["lab"],
		"kernel": "` + kernel + `", "initrd": "` + initrd + `", "cmdline": "console=ttyS0 rdinit=/bin/sh"}`}})
	d := startDriver(t, cat)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan region.Event, 64)
	go func() {
		_ = d.Watch(ctx, "", func(ev region.Event) error {
			select {
			case events <- ev:
			default:
			}
			return nil
		})
	}()

	spec := labSpec("stuck")
	spec.ImageID = "stuck"
	srv, err := d.CreateServer(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.DeleteServer(context.Background(), srv.ID) })
	if srv.State != region.ServerBuilding {
		t.Fatalf("new server %s, want BUILDING", srv.State)
	}
	// The owner must hear of it: a server event, after which the server reads ERROR.
	var got region.Server
	limit := time.After(2 * time.Minute)
	for got.State != region.ServerError {
		select {
		case ev := <-events:
			if ev.ServerID != srv.ID {
				continue
			}
			if got, err = d.GetServer(ctx, srv.ID); err != nil {
				t.Fatal(err)
			}
		case <-limit:
			t.Fatalf("no event announced the server ERROR past its build timeout; last read %+v", got)
		}
	}
	if !strings.Contains(got.Message, "did not take its network address within 15s") {
		t.Errorf("message %q, want it to say the guest did not take its address in time", got.Message)
	}
	if got.PrivateIP != "" || got.Health != region.HealthError {
		t.Errorf("stalled server shows IP %q and health %s, want none and ERROR", got.PrivateIP, got.Health)
	}
	if err := d.DeleteServer(ctx, srv.ID); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, time.Minute, func() bool {
		_, err := d.GetServer(ctx, srv.ID)
		return errors.Is(err, region.ErrServerNotFound)
	}, "stalled server deleted")
}
