package libvirt_test

import (
	"context"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/virttest"
)

// A host reached by a qemu+ssh URI (an sshd in front of the daemon's socket) serves the region
// as a local one does: a server is made, runs and is deleted.
func TestLibvirtOverSSH(t *testing.T) {
	kernel, initrd := busybox(t)
	host := virttest.Start(t, virttest.Options{})
	through := host.SSH(t)
	d := startDriver(t, labCatalog(t, host, kernel, initrd, more{uri: through.URI}))
	ctx := context.Background()
	srv, err := d.CreateServer(ctx, labSpec("over-ssh"))
	if err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, 3*time.Minute, func() bool {
		got, err := d.GetServer(ctx, srv.ID)
		return err == nil && got.State == region.ServerRunning && got.PrivateIP != ""
	}, "server RUNNING with its address")
	if err := d.DeleteServer(ctx, srv.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.GetServer(ctx, srv.ID); err == nil {
		t.Error("the server is still there after its delete")
	}
}
