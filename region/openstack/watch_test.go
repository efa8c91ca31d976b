package openstack

import (
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"github.com/computeql/computeql/region"
)

// TestWatchEvents: what one watch reports of the servers Nova lists as changed, poll after poll,
// each listing from a few seconds before the cursor.
func TestWatchEvents(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	desc := "computeql acme/web/os/os-web i-1"
	md := map[string]string{metaInstance: "i-1", metaOrg: "acme", metaProject: "web", metaRegion: "os", metaNetwork: "os-web", "compute:tag:made.2Fby": "me"}
	at := func(status, task string, created, updated time.Time, metadata map[string]string) changed {
		return changed{Server: servers.Server{ID: "s1", Status: status, TaskState: task, Created: created, Updated: updated, Metadata: metadata}, Description: desc}
	}
	scope := region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: "os", NetworkID: "os-web"}
	d := &Driver{opts: Options{Region: region.Region{ID: "os"}}}
	w := newWatcher(d, time.Time{})
	since := t0.Add(-watchOverlap)

	for i, step := range []struct {
		name string
		s    changed
		want region.EventKind // "" for no event
	}{
		{"built, first seen", at("BUILD", "scheduling", t0, t0, md), region.ServerCreated},
		{"the same change listed again by the overlap", at("BUILD", "scheduling", t0, t0, md), ""},
		{"another state within the same second", at("BUILD", "spawning", t0, t0, md), region.ServerUpdated},
		{"running, within the same second still", at("ACTIVE", "", t0, t0, md), region.ServerUpdated},
		{"its metadata changed a second later", at("ACTIVE", "", t0, t0.Add(time.Second), map[string]string{
			metaInstance: "i-1", metaOrg: "acme", metaProject: "web", metaRegion: "os", metaNetwork: "os-web", metaAllowed: "192.0.2.0/24",
		}), region.ServerUpdated},
		{"deleted: Nova has forgotten its metadata", at("DELETED", "", t0, t0.Add(2*time.Second), nil), region.ServerDeleted},
	} {
		ev, ok := w.event(&step.s, since)
		// A server listed BUILD is read at every poll until it is listed otherwise, since Nova
		// may delete it without listing the deletion.
		if _, tracked := w.building["s1"]; tracked != (step.s.Status == "BUILD") {
			t.Errorf("step %d (%s): tracked as building: %t", i, step.name, tracked)
		}
		if step.want == "" {
			if ok {
				t.Errorf("step %d (%s): reported %+v, want nothing", i, step.name, ev)
			}
			continue
		}
		if !ok || ev.Kind != step.want || ev.ServerID != "s1" || ev.Scope != scope || ev.Tags[region.InstanceTag] != "i-1" ||
			ev.Cursor != step.s.Updated.Format(time.RFC3339) {
			t.Errorf("step %d (%s): %+v (%t); want %s of s1 in %+v with its instance tag, at cursor %s",
				i, step.name, ev, ok, step.want, scope, step.s.Updated.Format(time.RFC3339))
		}
	}

	for name, s := range map[string]changed{
		"a server of another region":      {Server: servers.Server{ID: "s2", Status: "ACTIVE", Updated: t0}, Description: "computeql acme/web/other/n i-2"},
		"a server computeql did not make": {Server: servers.Server{ID: "s3", Status: "ACTIVE", Updated: t0}, Description: "made by hand"},
	} {
		if ev, ok := w.event(&s, since); ok {
			t.Errorf("%s: reported %+v", name, ev)
		}
	}

	// A watch resumed from a cursor well after a server's creation reports it updated.
	later := newWatcher(d, time.Time{})
	s := at("SHUTOFF", "", t0, t0.Add(time.Minute), md)
	if ev, ok := later.event(&s, t0.Add(time.Minute-watchOverlap)); !ok || ev.Kind != region.ServerUpdated {
		t.Errorf("a server made long before the watch: %+v (%t), want it updated", ev, ok)
	}
}
