package libvirt

import (
	"bytes"
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
	virttest.Require(t)
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
	results := make(chan error, diskCopies+1)
	mine, err := host.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mine.Disconnect() })
	d.mu.RLock()
	pool := d.pool
	d.mu.RUnlock()

	// listed is every copy's qemu-img that wrote its PID down; copying, those of them that
	// have stopped themselves (one that has not yet would miss a continue sent meanwhile).
	listed := func() []int {
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
	copying := func() []int {
		var pids []int
		for _, pid := range listed() {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			// "pid (comm) state ...": comm may hold spaces and parentheses.
			if err == nil && bytes.HasPrefix(stat[bytes.LastIndexByte(stat, ')')+1:], []byte(" T")) {
				pids = append(pids, pid)
			}
		}
		return pids
	}
	ended := func() error {
		select {
		case err := <-results:
			return err
		case <-time.After(time.Minute):
			t.Fatal("a copy continued did not end within a minute")
			return nil
		}
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
	var copies sync.WaitGroup
	t.Cleanup(func() {
		// Continued until every copy ended: one may stop itself after a continue.
		done := make(chan struct{})
		go func() {
			copies.Wait()
			close(done)
		}()
		retry := time.NewTicker(100 * time.Millisecond)
		defer retry.Stop()
		for {
			for _, pid := range listed() {
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
			select {
			case <-done:
				return
			case <-retry.C:
			}
		}
	})
	for _, rec := range recs {
		copies.Go(func() { results <- d.copyDisk(t.Context(), pool, rec) })
	}
	eventually.Holds(t, time.Minute, func() bool { return len(copying()) == diskCopies },
		"%d copies under way", diskCopies)

	// Two guests whose QEMU is stopped, made on the test's connection, and a call on the
	// driver's connection for each, which waits on the guest's monitor until the guest is
	// continued as the test ends (before this cleanup, registered first, waits for the calls).
	var waiting sync.WaitGroup
	t.Cleanup(waiting.Wait)
	for i := range 2 {
		dom := stoppedGuest(t, host, mine, fmt.Sprintf("held-up-%d", i))
		waiting.Go(func() { _ = conn.DomainSuspend(dom) })
		eventually.Holds(t, time.Minute, func() bool {
			state, _, _, err := mine.DomainGetControlInfo(dom, 0)
			return err == nil && golibvirt.DomainControlState(state) != golibvirt.DomainControlOk
		}, "the suspend of %s waits on its monitor (never read by libvirtd when the copies hold the driver's connection's room)", dom.Name)
	}
	if err := alive(conn); err != nil {
		t.Fatalf("a call on the driver's connection while the copies run (on it, they would hold its room): %v", err)
	}
	if n := len(listed()); n != diskCopies {
		t.Fatalf("%d copies under way, want %d: the last should wait for a turn", n, diskCopies)
	}

	first := copying()[0]
	if err := syscall.Kill(first, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := ended(); err != nil {
		t.Fatalf("the copy continued: %v", err)
	}
	eventually.Holds(t, time.Minute, func() bool { return len(copying()) == diskCopies && len(listed()) == diskCopies+1 },
		"the copy that waited starts once one ended")
	for _, pid := range copying() {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	for range diskCopies {
		if err := ended(); err != nil {
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
