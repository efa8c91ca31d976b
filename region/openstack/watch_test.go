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
		{"rebooting, within the same second still", at("REBOOT", "reboot_started", t0, t0, md), region.ServerUpdated},
		// Back to a state reported before, with the same updated time: the end of the reboot.
		{"running again", at("ACTIVE", "", t0, t0, md), region.ServerUpdated},
		{"the same listed again", at("ACTIVE", "", t0, t0, md), ""},
		{"its metadata changed a second later", at("ACTIVE", "", t0, t0.Add(time.Second), map[string]string{
			metaInstance: "i-1", metaOrg: "acme", metaProject: "web", metaRegion: "os", metaNetwork: "os-web", metaAllowed: "192.0.2.0/24",
		}), region.ServerUpdated},
		{"deleted: Nova has forgotten its metadata", at("DELETED", "", t0, t0.Add(2*time.Second), nil), region.ServerDeleted},
	} {
		ev, ok := w.event(&step.s, since)
		// A server listed in the middle of something is read at every poll until it is listed
		// otherwise, since Nova may not list how it ends.
		if _, tracked := w.unsettled["s1"]; tracked != (step.s.Status == "BUILD" || step.s.TaskState != "") {
			t.Errorf("step %d (%s): tracked as unsettled: %t", i, step.name, tracked)
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

// TestWatchReportsTheEndOfAVerb: a server a verb of this process acted on is read until it
// settles and reported then, even in the state the watch reported before the verb (a reboot
// over within the second it began: Nova's updated time and the state are as before); a server
// this process made is left to the listing, which reports it created.
func TestWatchReportsTheEndOfAVerb(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	md := map[string]string{metaInstance: "i-1", metaOrg: "acme", metaProject: "web", metaRegion: "os", metaNetwork: "os-web"}
	active := changed{Server: servers.Server{ID: "s1", Status: "ACTIVE", Created: t0, Updated: t0, Metadata: md},
		Description: "computeql acme/web/os/os-web i-1"}
	d := &Driver{opts: Options{Region: region.Region{ID: "os"}}}
	w := newWatcher(d, t0)
	since := t0.Add(-watchOverlap)
	if _, ok := w.event(&active, since); !ok {
		t.Fatal("the first listing of the server is not reported")
	}
	ev := region.Event{Kind: region.ServerUpdated, ServerID: "s1"}
	d.remember(ev, false)
	w.takeTouched()
	if p, ok := w.unsettled["s1"]; !ok || !p.forced {
		t.Fatalf("after a verb the server is unsettled %t, forced %t; want both", ok, p.forced)
	}
	if got, ok := w.event(&active, since); !ok || got.Kind != region.ServerUpdated {
		t.Errorf("the server listed as before the verb: %+v (%t), want it reported updated", got, ok)
	}
	if _, ok := w.event(&active, since); ok {
		t.Error("the same listing again is reported again")
	}
	w.takeTouched()
	if len(w.unsettled) != 0 {
		t.Errorf("the same touch taken up twice: unsettled %v", w.unsettled)
	}

	made := region.Event{Kind: region.ServerUpdated, ServerID: "s2"}
	d.remember(made, true)
	d.remember(made, false) // acted on before any listing: still to be reported created
	w.takeTouched()
	if p, ok := w.unsettled["s2"]; !ok || !p.unlisted || p.forced {
		t.Errorf("a server made here and never listed: unsettled %t, unlisted %t, forced %t; want unsettled and unlisted",
			ok, p.unlisted, p.forced)
	}
}
