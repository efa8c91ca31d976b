package server

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/store"
)

// TestSnapshotResumesWhereItWasCut: a subscriber cut off in the middle of a 1,000-instance
// snapshot resumes after the last SNAPSHOT event it received and, before SYNCED, gets every
// instance exactly once: the changes of those it had, the rest as they are now. An instance
// deleted meanwhile is not sent; one created meanwhile is.
func TestSnapshotResumesWhereItWasCut(t *testing.T) {
	const n, cut = 1000, 400
	a, s := wsServer(t, func(o *Options) { o.RateLimit = -1 })
	tok := a.admin(t)
	a.mustPost(t, tok, `mutation { setQuota(input: {organizationId: "acme", limits: [
		{kind: "servers", limit: 2000}, {kind: "cpus", limit: 100000}, {kind: "memoryGiB", limit: 100000}]}) { userErrors { message } } }`, nil)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = a.mustCreate(t, tok, createInput(fmt.Sprintf("vm-%04d", i))).ID
	}
	c := subscribeWS(t, s, protoTransportWS, tok, subQuery("acme", ""))
	have := map[string]int{} // id → generation received
	var last subEvent
	for range cut {
		last = c.event()
		if last.Kind != "SNAPSHOT" {
			t.Fatalf("event %+v, want SNAPSHOT", last)
		}
		have[last.Instance.ID] = last.Instance.Generation
	}
	c.stop()
	if last.Instance.ID != ids[cut-1] {
		t.Fatalf("the snapshot's %dth instance is %s, want %s: it goes in id order", cut, last.Instance.ID, ids[cut-1])
	}

	// Meanwhile: one received instance changes, one not yet received changes, one not yet
	// received goes, and one is created.
	early, late, gone := ids[10], ids[cut+10], ids[cut+20]
	a.describe(t, tok, early, "changed after it was sent")
	a.describe(t, tok, late, "changed before it was sent")
	if ok, err := store.New(a.rdb).Forget(context.Background(), mustGetStored(t, a, gone), time.Now()); err != nil || !ok {
		t.Fatal(err, ok)
	}
	created := a.mustCreate(t, tok, createInput("vm-new")).ID

	c = subscribeWS(t, s, protoTransportWS, tok, subQuery("acme", last.Cursor))
	var replayed []string
	for {
		ev := c.event()
		if ev.Kind == "SYNCED" {
			break
		}
		switch ev.Kind {
		case "SNAPSHOT":
			if _, dup := have[ev.Instance.ID]; dup {
				t.Fatalf("%s sent twice", ev.Instance.ID)
			}
		case "UPDATED":
			replayed = append(replayed, ev.Instance.ID)
		default:
			t.Fatalf("unexpected %+v before SYNCED", ev)
		}
		have[ev.Instance.ID] = ev.Instance.Generation
	}
	if !slices.Equal(replayed, []string{early}) {
		t.Errorf("replayed changes of %v, want only that of the instance sent before the cut, %s", replayed, early)
	}
	want := slices.DeleteFunc(append(slices.Clone(ids), created), func(id string) bool { return id == gone })
	if got := slices.Sorted(maps.Keys(have)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("after SYNCED the subscriber has %d instances, want the %d that exist", len(got), len(want))
	}
	if have[early] != 2 || have[late] != 2 {
		t.Errorf("generations %d and %d of the instances changed meanwhile, want 2", have[early], have[late])
	}
}

// mustGetStored reads an instance from the store, as the workers do.
func mustGetStored(t *testing.T, a *api, id string) *instance.Instance {
	t.Helper()
	inst, err := store.New(a.rdb).Get(context.Background(), []string{"acme"}, id)
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

// TestBookmarksKeepAFilteredCursorAlive: a subscriber to one project that allows bookmarks
// gets BOOKMARK events while 20,000 events of another project pass by; resuming after the
// last bookmark works where resuming after its last own event is CURSOR_EXPIRED, since the
// log has been trimmed past it; and the next change of its project arrives.
func TestBookmarksKeepAFilteredCursorAlive(t *testing.T) {
	a, s := wsServer(t, func(o *Options) { o.RateLimit, o.BookmarkInterval = -1, 50*time.Millisecond })
	tok := a.admin(t)
	web := mustGetStored(t, a, a.mustCreate(t, tok, createInput("web-1")).ID)
	data := a.mustCreate(t, tok, with("data-1", map[string]any{"projectId": "data", "networkId": "net-acme-data-eu"}))
	query := func(after string) string {
		args := `organizationId: "acme", projectId: "data", allowBookmarks: true`
		if after != "" {
			args += fmt.Sprintf(", after: %q", after)
		}
		return `subscription { instanceEvents(` + args + `) { cursor kind changedFields instance { id name generation status { provisioningStatus } } } }`
	}
	c := subscribeWS(t, s, protoTransportWS, tok, query(""))
	if ev := c.event(); ev.Kind != "SNAPSHOT" || ev.Instance.ID != data.ID {
		t.Fatalf("snapshot %+v", ev)
	}
	synced := c.synced()

	st := store.New(a.rdb)
	warn := func(n int) string {
		for range n {
			if ok, err := st.Warn(context.Background(), web, time.Now(), ""); err != nil || !ok {
				t.Fatal(err, ok)
			}
		}
		pos, err := st.LastEvent(context.Background(), "acme")
		if err != nil {
			t.Fatal(err)
		}
		return pos
	}
	lastWeb := warn(20_000)
	var bookmark subEvent
	for {
		bookmark = c.event()
		if bookmark.Kind != "BOOKMARK" || bookmark.Instance.ID != "" {
			t.Fatalf("got %+v, want only BOOKMARK events while another project changes", bookmark)
		}
		pos, _, err := instance.DecodeSubscriptionCursor(bookmark.Cursor)
		if err != nil {
			t.Fatal(err)
		}
		if pos == lastWeb {
			break
		}
	}
	c.stop()

	if codes, m := subscribeWS(t, s, protoTransportWS, tok, query(synced.Cursor)).opErrorCodes(); !slices.Equal(codes, []string{"CURSOR_EXPIRED"}) {
		t.Fatalf("resuming after the last own event: %v %s; want CURSOR_EXPIRED, or the test shows nothing", codes, m.Payload)
	}
	c = subscribeWS(t, s, protoTransportWS, tok, query(bookmark.Cursor))
	a.describe(t, tok, data.ID, "after the bookmark")
	if ev := c.event(); ev.Kind != "UPDATED" || ev.Instance.ID != data.ID {
		t.Fatalf("after resuming at the bookmark: %+v, want the UPDATED of %s", ev, data.ID)
	}
}
