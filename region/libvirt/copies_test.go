package libvirt

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/virttest"
)

// Snapshots' disk copies take turns, diskCopies at a time, each on a connection of its own:
// with every turn taken by a copy that does not end and two calls on the driver's connection
// held up behind guests that do not answer, the connection still answers a third call (on it,
// the copies and those two would take all five calls libvirtd reads of a connection at once).
// Once a copy ends, the copy waiting for a turn starts; every copy makes its volume.
func TestLibvirtDiskCopiesTakeTurnsOnConnectionsOfTheirOwn(t *testing.T) {
	// The host's qemu-img, run for a copy (convert), writes its PID down and stops itself
	// until the test continues it: a copy that takes as long as the test wants.
	bin := t.TempDir()
	held := filepath.Join(bin, "held")
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = convert ]; then echo $$ >> %s; kill -STOP $$; fi\nexec %s \"$@\"\n", held, qemuImg)
	if err := os.WriteFile(filepath.Join(bin, "qemu-img"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH")) // libvirtd's
	host := virttest.Start(t, virttest.Options{})
	rs, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	d, conn := labDriverWith(t, labCatalogJSON(host, ""), rs.Addr, func(*Options) {})
	mine, err := host.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mine.Disconnect() })
	d.mu.RLock()
	pool := d.pool
	d.mu.RUnlock()

	copying := func() []int {
		data, _ := os.ReadFile(held)
		var pids []int
		for _, f := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				t.Fatalf("%s: %v", held, err)
			}
			pids = append(pids, pid)
		}
		return pids
	}
	recs := make([]*snapshotRecord, diskCopies+1)
	for i := range recs {
		id := fmt.Sprintf("copy-%d", i)
		def := libvirtxml.StorageVolume{Name: namePrefix + id + ".qcow2", Capacity: &libvirtxml.StorageVolumeSize{Value: 16, Unit: "MiB"},
			Target: &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}}}
		doc, err := def.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mine.StorageVolCreateXML(pool, doc, 0); err != nil {
			t.Fatal(err)
		}
		recs[i] = &snapshotRecord{Server: id, Image: region.Image{ID: id, Volume: imageVolumeName(id)}}
	}
	results := make(chan error, len(recs))
	var copies sync.WaitGroup
	t.Cleanup(func() {
		for _, pid := range copying() {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
		copies.Wait()
	})
	for _, rec := range recs {
		copies.Go(func() { results <- d.copyDisk(t.Context(), pool, rec) })
	}
	eventually.Holds(t, time.Minute, func() bool { return len(copying()) == diskCopies },
		"%d copies under way", diskCopies)

	// Two guests whose QEMU is stopped, made on the test's connection, and a call on the
	// driver's connection for each, which waits on the guest's monitor.
	var waiting sync.WaitGroup
	var guests []int
	t.Cleanup(func() {
		for _, pid := range guests {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
		waiting.Wait()
	})
	for i := range 2 {
		def := libvirtxml.Domain{Type: "qemu", Name: fmt.Sprintf("held-up-%d", i), Memory: &libvirtxml.DomainMemory{Value: 64, Unit: "MiB"},
			OS: &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}}}
		doc, err := def.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		dom, err := mine.DomainCreateXML(doc, 0)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := host.DomainPID(def.Name)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		guests = append(guests, pid)
		waiting.Go(func() { _ = conn.DomainSuspend(dom) })
		eventually.Holds(t, time.Minute, func() bool {
			state, _, _, err := mine.DomainGetControlInfo(dom, 0)
			return err == nil && golibvirt.DomainControlState(state) != golibvirt.DomainControlOk
		}, "the suspend of %s waits on its monitor (never read by libvirtd when the copies hold the driver's connection's room)", def.Name)
	}
	answered := make(chan error, 1)
	go func() {
		_, err := conn.ConnectGetLibVersion()
		answered <- err
	}()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("a call on the driver's connection while the copies run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a call on the driver's connection went unanswered while the copies run: they hold its room")
	}
	if n := len(copying()); n != diskCopies {
		t.Fatalf("%d copies under way, want %d: the last should wait for a turn", n, diskCopies)
	}

	first := copying()[0]
	if err := syscall.Kill(first, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := <-results; err != nil {
		t.Fatalf("the copy continued: %v", err)
	}
	eventually.Holds(t, time.Minute, func() bool { return len(copying()) == diskCopies+1 },
		"the copy that waited starts once one ended")
	for _, pid := range copying()[1:] {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	for range diskCopies {
		if err := <-results; err != nil {
			t.Errorf("a copy: %v", err)
		}
	}
	if err := mine.StoragePoolRefresh(pool, 0); err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		if _, err := mine.StorageVolLookupByName(pool, rec.Image.Volume); err != nil {
			t.Errorf("the image volume %s: %v", rec.Image.Volume, err)
		}
	}
}
