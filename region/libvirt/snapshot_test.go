package libvirt_test

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/virttest"
)

// TestLibvirtSnapshotCutShort: a snapshot whose maker died after taking it (the server runs on
// the snapshot's overlay, the image's record says CREATING, nobody holds its lease) is cleaned
// by the next driver to connect: the server's disk is its own overlay again, merged while it
// runs, the overlay is gone, and the image is FAILED.
func TestLibvirtSnapshotCutShort(t *testing.T) {
	kernel, initrd := busybox(t)
	host := virttest.Start(t, virttest.Options{})
	cat := labCatalog(t, host, kernel, initrd, more{images: []string{diskImage(t, kernel, initrd)}})
	d := startDriver(t, cat)
	spec := labSpec("cut-short")
	spec.ImageID = "busybox-disk"
	srv, err := d.CreateServer(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, 2*time.Minute, func() bool {
		got, err := d.GetServer(t.Context(), srv.ID)
		return err == nil && got.State == region.ServerRunning
	}, "server %s RUNNING", srv.ID)

	conn, err := host.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Disconnect() })
	dom, err := conn.DomainLookupByName("computeql-" + srv.ID)
	if err != nil {
		t.Fatal(err)
	}
	pool := filepath.Join(host.Dir, "pool")
	own, overlay := filepath.Join(pool, dom.Name+".qcow2"), filepath.Join(pool, dom.Name+"-snap.qcow2")
	snap := libvirtxml.DomainSnapshot{Disks: &libvirtxml.DomainSnapshotDisks{Disks: []libvirtxml.DomainSnapshotDisk{
		{Name: "vda", Snapshot: "external", Driver: &libvirtxml.DomainDiskDriver{Type: "qcow2"},
			Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: overlay}}},
		{Name: "vdb", Snapshot: "no"},
	}}}
	doc, err := snap.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.DomainSnapshotCreateXML(dom, doc, uint32(golibvirt.DomainSnapshotCreateDiskOnly|golibvirt.DomainSnapshotCreateNoMetadata)); err != nil {
		t.Fatal(err)
	}
	if got := diskOf(t, conn, dom); got != overlay {
		t.Fatalf("after the snapshot the disk is %s, want the overlay %s", got, overlay)
	}
	imageID := uuid.NewString()
	rec, err := json.Marshal(map[string]any{"server": srv.ID, "image": region.Image{
		ID: imageID, Name: "cut-short", Architecture: "x86_64", Virtualization: "virtualized", State: region.ImageStateCreating,
		Regions: []string{"lab"}, OrganizationID: spec.OrganizationID, ProjectID: spec.ProjectID, Volume: "computeql-snap-" + imageID + ".qcow2",
	}})
	if err != nil {
		t.Fatal(err)
	}
	// The Redis the first driver uses, as it is.
	rdb := redis.NewClient(&redis.Options{Addr: redisServer.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.HSet(t.Context(), "libvirt:{lab}:images", imageID, rec).Err(); err != nil {
		t.Fatal(err)
	}

	next := runDriver(t, cat, rdb) // cleans as it connects
	var last region.ImageState
	eventually.Holds(t, 2*time.Minute, func() bool {
		images, err := next.Images(t.Context(), spec.OrganizationID, spec.ProjectID)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(images, func(im region.Image) bool { return im.ID == imageID })
		if i >= 0 {
			last = images[i].State
		}
		return last == region.ImageStateFailed
	}, "image %s FAILED (last seen %s)", imageID, eventually.Lazy(func() string { return string(last) }))
	if got := diskOf(t, conn, dom); got != own {
		t.Errorf("after the clean-up the disk is %s, want its own overlay %s", got, own)
	}
	if state, _, err := conn.DomainGetState(dom, 0); err != nil || golibvirt.DomainState(state) != golibvirt.DomainRunning {
		t.Errorf("after the clean-up the domain is in state %d (%v), want running", state, err)
	}
	p, err := conn.StoragePoolLookupByName("computeql")
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.StoragePoolRefresh(p, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.StorageVolLookupByName(p, dom.Name+"-snap.qcow2"); err == nil {
		t.Errorf("the overlay %s is still in the pool", overlay)
	}
}

// diskOf is the file the running domain's vda is.
func diskOf(t *testing.T, conn *golibvirt.Libvirt, dom golibvirt.Domain) string {
	t.Helper()
	doc, err := conn.DomainGetXMLDesc(dom, 0)
	if err != nil {
		t.Fatal(err)
	}
	var def libvirtxml.Domain
	if err := def.Unmarshal(doc); err != nil {
		t.Fatal(err)
	}
	for _, disk := range def.Devices.Disks {
		if disk.Target != nil && disk.Target.Dev == "vda" && disk.Source != nil && disk.Source.File != nil {
			return disk.Source.File.File
		}
	}
	return ""
}
