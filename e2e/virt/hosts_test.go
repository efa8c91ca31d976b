package virt

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/virttest"
)

// TestLibvirtHosts runs a region of two hosts (two libvirtd in two namespaces) through the
// API: two instances spread, one on each; a flavor too big for either waits, saying that no
// host of the region has room for it; while one host's daemon is stopped, its instance shows a
// condition naming the host and the other instance none; when the daemon is back, the instance
// is RUNNING again without its server having been made anew.
func TestLibvirtHosts(t *testing.T) {
	t.Parallel()
	racks := []*virttest.Host{virttest.Start(t, virttest.Options{}), virttest.Start(t, virttest.Options{})}
	c := busyboxCatalogue(t)
	c.hosts = racks
	c.flavors = append(c.flavors, flavor("huge", 1, 4096, 2, nil))
	lab := deploy(t, writeCatalog(t, racks[0], c))
	f := lab.follow(t)
	ctx := context.Background()

	var ids []string
	step(t, "two instances spread over the hosts", func(t *testing.T) {
		// Placement leaves out a host the worker is not connected to yet, which would put
		// both instances on the other.
		for _, h := range racks {
			eventually.Holds(t, stepLimit, func() bool { return connectedTo(lab.worker, h) },
				"the worker connected to %s; its log:\n%s", h.URI, eventually.Lazy(func() string { return lab.worker.Tail(30) }))
		}
		for _, name := range []string{"one", "two"} {
			ids = append(ids, lab.mustCreate(ctx, t, map[string]any{"name": name, "flavorId": "tiny", "imageId": "busybox"}))
		}
		for _, id := range ids {
			awaitRunning(ctx, t, lab, id)
		}
		for i, h := range racks {
			if doms := inspect(t, h).domains(t); len(doms) != 1 {
				t.Errorf("rack%d holds %v, want one domain of the two", i+1, names(doms))
			}
		}
	})

	step(t, "a flavor too big for either host waits for capacity", func(t *testing.T) {
		huge := lab.mustCreate(ctx, t, map[string]any{"name": "huge", "flavorId": "huge", "imageId": "busybox"})
		ev := f.until(t, stepLimit, "a NoCapacity condition", of(huge, func(ev event) bool { return hasReason(ev.Instance, "NoCapacity") }))
		if !slices.ContainsFunc(ev.Instance.Status.Conditions, func(c condition) bool {
			return c.Reason == "NoCapacity" && strings.Contains(c.Message, "no host of region lab has room for flavor huge")
		}) {
			t.Errorf("the waiting instance does not say that no host of region lab has room for flavor huge: %s", ev.Instance)
		}
		lab.verb(ctx, t, "deleteInstance", huge, nil)
	})

	step(t, "a stopped daemon's instance shows it, and recovers when it is back", func(t *testing.T) {
		if err := racks[1].StopDaemon(); err != nil {
			t.Fatal(err)
		}
		ev := f.until(t, stepLimit, "an instance whose host cannot be reached", func(ev event) bool {
			return slices.Contains(ids, ev.Instance.ID) && hasReason(ev.Instance, "RegionUnreachable")
		})
		away := ev.Instance.ID
		if !slices.ContainsFunc(ev.Instance.Status.Conditions, func(c condition) bool {
			return c.Reason == "RegionUnreachable" && strings.Contains(c.Message, "Host rack2 of region lab")
		}) {
			t.Errorf("the condition does not name host rack2: %s", ev.Instance)
		}
		for _, id := range ids {
			if inst := lab.get(ctx, t, id); id != away && hasReason(inst, "RegionUnreachable") {
				t.Errorf("the instance on the host still up shows its host unreachable: %s", inst)
			}
		}
		before := names(inspect(t, racks[0]).domains(t))
		if err := racks[1].StartDaemon(ctx); err != nil {
			t.Fatal(err)
		}
		f.until(t, stepLimit, "the instance reconciled again", of(away, func(ev event) bool {
			return !hasReason(ev.Instance, "RegionUnreachable") && ev.Instance.running()
		}))
		if after := names(inspect(t, racks[0]).domains(t)); !slices.Equal(before, after) {
			t.Errorf("rack1's domains went from %v to %v while rack2 was away: a server was made again", before, after)
		}
	})

	step(t, "deleting them leaves nothing behind", func(t *testing.T) {
		for _, id := range ids {
			lab.verb(ctx, t, "deleteInstance", id, nil)
		}
		gone := map[string]bool{}
		f.until(t, stepLimit, "both DELETED", func(ev event) bool {
			if ev.Kind == "DELETED" {
				gone[ev.Instance.ID] = true
			}
			return gone[ids[0]] && gone[ids[1]]
		})
		for i, h := range racks {
			if doms := inspect(t, h).domains(t); len(doms) > 0 {
				t.Errorf("domains left on rack%d: %v", i+1, names(doms))
			}
		}
	})
}

// connectedTo reports whether the worker's log says it connected to the host, in this run or
// an earlier one.
func connectedTo(worker *harness.Process, h *virttest.Host) bool {
	for _, line := range strings.Split(worker.Log(), "\n") {
		if strings.Contains(line, "connected to libvirt host") && strings.Contains(line, h.URI) {
			return true
		}
	}
	return false
}
