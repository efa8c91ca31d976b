package openstack

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"github.com/computeql/computeql/region"
)

// watchOverlap is how far before its cursor each poll asks: a change that Nova commits late
// may carry an updated time earlier than one already seen.
const watchOverlap = 5 * time.Second

// cursorLayout is Nova's own format of its timestamps, which a cursor is one of.
const cursorLayout = time.RFC3339

// Watch polls Nova for the servers changed since the cursor, every poll interval; a poll that
// fails is tried again at the next, from the same cursor, so nothing is missed while the
// cloud is away.
func (d *Driver) Watch(ctx context.Context, after string, fn func(region.Event) error) error {
	var cursor time.Time
	if after != "" {
		var err error
		if cursor, err = time.Parse(cursorLayout, after); err != nil {
			return fmt.Errorf("openstack: watch cursor %q is not a time such as %s: %w", after, cursorLayout, region.ErrRefused)
		}
	}
	w := newWatcher(d, cursor)
	tick := time.NewTicker(d.pollInterval)
	defer tick.Stop()
	for {
		if err := w.poll(ctx, fn); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// watcher is the state of one watch.
type watcher struct {
	d      *Driver
	cursor time.Time // zero until the cloud's clock has been read
	// seen are the changes reported, by their fingerprint → updated, within the overlap.
	seen map[string]time.Time
	// created are the servers reported created, by their creation time, within the overlap.
	created map[string]time.Time
	// building are the servers last listed BUILD, with the event that reported them. Nova
	// deletes a server that has not reached a compute cell yet without moving its updated time,
	// so its deletion never shows in changes-since: each poll reads these servers one by one.
	// The servers this process made and the watch has not listed yet are read so too.
	building map[string]region.Event
	// listed are the servers this process made that the watch has listed or read gone.
	listed map[string]bool
}

func newWatcher(d *Driver, cursor time.Time) *watcher {
	return &watcher{d: d, cursor: cursor, seen: map[string]time.Time{}, created: map[string]time.Time{},
		building: map[string]region.Event{}, listed: map[string]bool{}}
}

// poll reports the changes since the last; only fn's error ends the watch.
func (w *watcher) poll(ctx context.Context, fn func(region.Event) error) error {
	if w.cursor.IsZero() {
		now, err := w.d.cloudNow(ctx)
		if err != nil {
			w.d.log.Warn("openstack: watch: read the cloud's clock", "err", err)
			return nil
		}
		w.cursor = now
	}
	since := w.cursor.Add(-watchOverlap)
	list, err := w.d.changedSince(ctx, since)
	if err != nil {
		w.d.log.Warn("openstack: watch: list changed servers", "since", since, "err", err)
		return nil
	}
	slices.SortFunc(list, func(a, b changed) int {
		return cmp.Or(a.Updated.Compare(b.Updated), cmp.Compare(a.ID, b.ID))
	})
	for i := range list {
		s := &list[i]
		// Every server listed moves the cursor, the region's or not, so that the servers of
		// other regions of the cloud project are not listed again and again.
		ev, ok := w.event(s, since)
		if ok {
			if err := fn(ev); err != nil {
				return err
			}
		}
		if s.Updated.After(w.cursor) {
			w.cursor = s.Updated
		}
	}
	// A server this process made that no listing has shown yet is read as one building: made
	// and deleted between two polls, it would otherwise never be reported.
	made := w.d.recentlyMade()
	for id := range w.listed {
		if _, ok := made[id]; !ok {
			delete(w.listed, id)
		}
	}
	for id, ev := range made {
		if _, known := w.building[id]; !known && !w.listed[id] {
			ev.Cursor = w.cursor.UTC().Format(cursorLayout)
			w.building[id] = ev
		}
		w.listed[id] = true
	}
	if err := w.checkBuilding(ctx, fn); err != nil {
		return err
	}
	for k, t := range w.seen {
		if t.Before(since) {
			delete(w.seen, k)
		}
	}
	for k, t := range w.created {
		if t.Before(since) {
			delete(w.created, k)
		}
	}
	return nil
}

// event is the report of a server's change, unless it is not the region's or was reported.
func (w *watcher) event(s *changed, since time.Time) (region.Event, bool) {
	scope, value, ok := decodeDescription(s.Description)
	if !ok || scope.RegionID != w.d.opts.Region.ID {
		return region.Event{}, false
	}
	tags := map[string]string{region.InstanceTag: value}
	// A deleted server has lost its metadata; the description still says whose it was.
	if len(s.Metadata) > 0 {
		tags = decodeSpec(s.Metadata).Tags
	}
	ev := region.Event{Cursor: s.Updated.UTC().Format(cursorLayout), Kind: region.ServerUpdated, ServerID: s.ID, Scope: scope, Tags: tags}
	if s.Status == "BUILD" {
		w.building[s.ID] = ev
	} else {
		delete(w.building, s.ID)
	}
	key := fingerprint(s)
	if _, dup := w.seen[key]; dup {
		return region.Event{}, false
	}
	w.seen[key] = s.Updated
	_, reported := w.created[s.ID]
	switch {
	case s.Status == "DELETED" || s.Status == "SOFT_DELETED":
		ev.Kind = region.ServerDeleted
	case !reported && !s.Created.Before(since):
		ev.Kind = region.ServerCreated
		w.created[s.ID] = s.Created
	}
	return ev, true
}

// checkBuilding reads the servers last listed BUILD, and reports those gone deleted; one that
// cannot be read now is read again at the next poll.
func (w *watcher) checkBuilding(ctx context.Context, fn func(region.Event) error) error {
	for id, ev := range w.building {
		var s *servers.Server
		err := w.d.call(ctx, "read building server "+id, func(ctx context.Context, c *clients) error {
			var err error
			s, err = servers.Get(ctx, c.compute, id).Extract()
			return err
		})
		switch {
		case errors.Is(err, errNotFound) || err == nil && (s.Status == "DELETED" || s.Status == "SOFT_DELETED"):
			delete(w.building, id)
			ev.Kind, ev.Cursor = region.ServerDeleted, w.cursor.UTC().Format(cursorLayout)
			if err := fn(ev); err != nil {
				return err
			}
		case err != nil:
			w.d.log.Warn("openstack: watch: read a building server", "server", id, "err", err)
		case s.Status != "BUILD":
			// Built: the listing reports it, having moved its updated time.
			delete(w.building, id)
		}
	}
	return nil
}

// fingerprint tells a change of a server from another. Nova's updated time has whole
// seconds, so it does not: a server can pass several states within one second, and each is
// a change.
func fingerprint(s *changed) string {
	b, _ := json.Marshal([]any{s.ID, s.Updated, s.Status, s.TaskState, s.PowerState, s.Fault.Message, s.Metadata})
	return string(b)
}

// changed is a server as the watch lists it, with the description gophercloud leaves out.
type changed struct {
	servers.Server
	Description string
}

// changedSince lists the servers of the cloud project changed since the time, deleted ones
// included.
func (d *Driver) changedSince(ctx context.Context, since time.Time) ([]changed, error) {
	var out []changed
	err := d.call(ctx, "list servers changed since "+since.Format(cursorLayout), func(ctx context.Context, c *clients) error {
		pages, err := servers.List(c.compute, servers.ListOpts{ChangesSince: since.UTC().Format(cursorLayout)}).AllPages(ctx)
		if err != nil {
			return err
		}
		list, err := servers.ExtractServers(pages)
		if err != nil {
			return err
		}
		var descs []struct {
			Description string `json:"description"`
		}
		if err := servers.ExtractServersInto(pages, &descs); err != nil {
			return err
		}
		if len(descs) != len(list) {
			return fmt.Errorf("%d servers, %d descriptions in one listing", len(list), len(descs))
		}
		out = make([]changed, len(list))
		for i := range list {
			out[i] = changed{Server: list[i], Description: descs[i].Description}
		}
		return nil
	})
	return out, err
}

// cloudNow is the time by Nova's clock, from the Date of one of its answers: a watch from now
// starts at the cloud's now, whatever the skew of this machine's clock.
func (d *Driver) cloudNow(ctx context.Context) (time.Time, error) {
	var now time.Time
	err := d.call(ctx, "read the cloud's clock", func(ctx context.Context, c *clients) error {
		resp, err := c.compute.Get(ctx, c.compute.ServiceURL("servers")+"?limit=1", nil, nil)
		if err != nil {
			return err
		}
		if now, err = http.ParseTime(resp.Header.Get("Date")); err != nil {
			return fmt.Errorf("the compute API's answer has no Date: %w", err)
		}
		return nil
	})
	return now, err
}
