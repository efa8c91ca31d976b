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
	// last is each server's change reported last, kept while it is within the overlap: a
	// listing again of the same change is not reported again, a server back in a state it had
	// before is.
	last map[string]reported
	// created are the servers reported created, by their creation time, within the overlap.
	created map[string]time.Time
	// unsettled are the servers in the middle of something (last listed BUILD, or in a task
	// such as a reboot or a stop; or touched by this process, see Driver.touched), with the
	// event that reports them: each poll reads them one by one until they settle, so that
	// the end of what they were doing is reported even where changes-since does not show it.
	// Nova deletes a server that has not reached a compute cell yet without moving its
	// updated time; a change committed more than watchOverlap after the time it carries (a
	// conductor held up between its write and its commit) is older than any later poll asks
	// for; and a server back where it was within one second (a fake compute's reboot) shows
	// the same updated time and state as before. There are as many as servers in the middle
	// of a verb at once.
	unsettled map[string]pending
	// taken are the touches of this process the watch has taken up, by server → when.
	taken map[string]time.Time
}

// pending is an unsettled server, with the event that reports it.
type pending struct {
	ev region.Event
	// unlisted: this process made it and no listing has shown it; once settled it is left to
	// the listing, which reports it created.
	unlisted bool
	// forced: a verb of this process acted on it; once settled it is reported, even in a state
	// the watch reported before the verb.
	forced bool
}

// reported is a change of a server the watch reported.
type reported struct {
	fingerprint string
	updated     time.Time
}

func newWatcher(d *Driver, cursor time.Time) *watcher {
	return &watcher{d: d, cursor: cursor, last: map[string]reported{}, created: map[string]time.Time{},
		unsettled: map[string]pending{}, taken: map[string]time.Time{}}
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
	w.takeTouched()
	if err := w.checkUnsettled(ctx, fn); err != nil {
		return err
	}
	for id, r := range w.last {
		if r.updated.Before(since) {
			delete(w.last, id)
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
	p, forced := w.unsettled[s.ID], false
	if unsettled(&s.Server) {
		p.ev, p.unlisted = ev, false
		w.unsettled[s.ID] = p
	} else {
		forced = p.forced
		delete(w.unsettled, s.ID)
	}
	if !w.fresh(s.ID, fingerprint(s), s.Updated) && !forced {
		return region.Event{}, false
	}
	_, reported := w.created[s.ID]
	switch {
	case deleted(&s.Server):
		ev.Kind = region.ServerDeleted
	case !reported && !s.Created.Before(since):
		ev.Kind = region.ServerCreated
		w.created[s.ID] = s.Created
	}
	return ev, true
}

// fresh records a server's change as the last reported, and reports whether it differs from
// the one before.
func (w *watcher) fresh(id, fingerprint string, updated time.Time) bool {
	if w.last[id].fingerprint == fingerprint {
		return false
	}
	w.last[id] = reported{fingerprint: fingerprint, updated: updated}
	return true
}

// takeTouched takes up the servers this process touched since the last poll: one it made that
// no listing has shown yet is read until it settles (made and deleted between two polls, it
// would otherwise never be reported); one a verb acted on is read until it settles, and
// reported then.
func (w *watcher) takeTouched() {
	touched := w.d.recentlyTouched()
	for id := range w.taken {
		if _, ok := touched[id]; !ok {
			delete(w.taken, id)
		}
	}
	for id, t := range touched {
		if w.taken[id].Equal(t.at) {
			continue
		}
		w.taken[id] = t.at
		t.ev.Cursor = w.cursor.UTC().Format(cursorLayout)
		p, known := w.unsettled[id]
		if _, listed := w.last[id]; t.made && !listed {
			if !known {
				w.unsettled[id] = pending{ev: t.ev, unlisted: true}
			}
			continue
		}
		p.ev, p.forced = t.ev, true
		w.unsettled[id] = p
	}
}

// unsettled reports whether a server is in the middle of something that will end.
func unsettled(s *servers.Server) bool {
	return s.Status == "BUILD" || s.Status == "REBOOT" || s.Status == "HARD_REBOOT" || s.TaskState != ""
}

// checkUnsettled reads the servers last listed unsettled: one gone is reported deleted, one
// settled in a state no listing reported is reported; one that cannot be read now is read
// again at the next poll.
func (w *watcher) checkUnsettled(ctx context.Context, fn func(region.Event) error) error {
	for id, p := range w.unsettled {
		ev := p.ev
		var s *servers.Server
		err := w.d.call(ctx, "read unsettled server "+id, func(ctx context.Context, c *clients) error {
			var err error
			s, err = servers.Get(ctx, c.compute, id).Extract()
			return err
		})
		switch {
		case errors.Is(err, errNotFound) || err == nil && deleted(s):
			delete(w.unsettled, id)
			ev.Kind, ev.Cursor = region.ServerDeleted, w.cursor.UTC().Format(cursorLayout)
			if err := fn(ev); err != nil {
				return err
			}
		case err != nil:
			w.d.log.Warn("openstack: watch: read an unsettled server", "server", id, "err", err)
		case !unsettled(s):
			delete(w.unsettled, id)
			if p.unlisted || !w.fresh(id, fingerprint(&changed{Server: *s}), s.Updated) && !p.forced {
				continue
			}
			ev.Kind, ev.Cursor = region.ServerUpdated, w.cursor.UTC().Format(cursorLayout)
			if err := fn(ev); err != nil {
				return err
			}
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
