package store

import (
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/instance"
)

// events returns the organization's event stream.
func events(t *testing.T, rdb *redis.Client, org string) []redis.XMessage {
	t.Helper()
	msgs, err := rdb.XRange(ctx, eventsKey(org), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// TestEveryCommitAppendsItsEvent: each committing script appends exactly one event, of its
// kind, carrying the instance as stored and the fields that changed; refused writes append
// nothing (the refusal tests compare whole snapshots, streams included).
func TestEveryCommitAppendsItsEvent(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	inst := create(t, s, newInstance("acme", "web", "a"))

	want := func(n int, kind, changed string) redis.XMessage {
		t.Helper()
		msgs := events(t, rdb, "acme")
		if len(msgs) != n {
			t.Fatalf("%d events, want %d", len(msgs), n)
		}
		m := msgs[n-1]
		if m.Values["kind"] != kind || m.Values["id"] != inst.ID || m.Values["proj"] != "web" || m.Values["changed"] != changed {
			t.Errorf("event %d = %v, want kind %s changed %q", n, m.Values, kind, changed)
		}
		return m
	}
	created := want(1, "CREATED", "")
	var spec instance.Spec
	if err := json.Unmarshal([]byte(created.Values["spec"].(string)), &spec); err != nil || spec.Name != "a" {
		t.Errorf("CREATED carries spec %v (%v)", created.Values["spec"], err)
	}
	if created.Values["gen"] != "1" || created.Values["sv"] != "1" {
		t.Errorf("CREATED gen/sv = %v/%v", created.Values["gen"], created.Values["sv"])
	}

	inst.Description = "changed"
	inst.UpdatedAt = inst.UpdatedAt.Add(time.Minute)
	if r, err := s.UpdateSpec(ctx, inst, nil, roomy, nil, []string{"description"}, instance.Idempotency{}); err != nil || r != nil {
		t.Fatal(err, r)
	}
	updated := want(2, "UPDATED", "description")
	if updated.Values["gen"] != "2" || updated.Values["at"] != strconv.FormatInt(inst.UpdatedAt.UnixMilli(), 10) {
		t.Errorf("UPDATED gen %v at %v", updated.Values["gen"], updated.Values["at"])
	}
	inst.Generation = 2

	st := inst.Status
	st.PowerState = instance.PowerRunning
	ev := instance.Event{Kind: instance.EventRebuildStarted, Changed: []string{"status.powerState"}, At: eventTime, Message: "m"}
	if ok, err := s.WriteStatus(ctx, inst, st, ev); err != nil || !ok {
		t.Fatal(err, ok)
	}
	status := want(3, "REBUILD_STARTED", "status.powerState")
	if status.Values["sv"] != "2" || status.Values["msg"] != "m" {
		t.Errorf("status event %v", status.Values)
	}
	inst.StatusVersion = 2

	if ok, err := s.Warn(ctx, inst, eventTime, "duplicates deleted"); err != nil || !ok {
		t.Fatal(err, ok)
	}
	if w := want(4, "WARNING", ""); w.Values["msg"] != "duplicates deleted" || w.Values["gen"] != "2" {
		t.Errorf("warning %v", w.Values)
	}

	if ok, err := s.Forget(ctx, inst, eventTime); err != nil || !ok {
		t.Fatal(err, ok)
	}
	deleted := want(5, "DELETED", "")
	if err := json.Unmarshal([]byte(deleted.Values["spec"].(string)), &spec); err != nil || spec.UpdatedAt != inst.UpdatedAt || spec.Name != "a" {
		t.Errorf("DELETED does not carry the instance as it was: %v", deleted.Values["spec"])
	}

	// Nothing is recorded for an instance that is gone.
	if ok, err := s.Warn(ctx, inst, eventTime, "late"); err != nil || ok {
		t.Errorf("warn on a forgotten instance: %v %v", ok, err)
	}
	if n := len(events(t, rdb, "acme")); n != 5 {
		t.Errorf("%d events after a warning on a forgotten instance", n)
	}
	// Events are per organization.
	if n := len(events(t, rdb, "globex")); n != 0 {
		t.Errorf("globex has %d events", n)
	}
}

// TestHistoryPicksOneInstanceOutOfTheLog: History pages through one instance's events among
// others', oldest first, resumes after a cursor, and refuses a cursor the log was trimmed past.
func TestHistoryPicksOneInstanceOutOfTheLog(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	a := create(t, s, newInstance("acme", "web", "a"))
	b := create(t, s, newInstance("acme", "web", "b"))
	for i := range 3 {
		for _, inst := range []*instance.Instance{a, b} {
			inst.Description = strconv.Itoa(i)
			if r, err := s.UpdateSpec(ctx, inst, nil, roomy, nil, []string{"description"}, instance.Idempotency{}); err != nil || r != nil {
				t.Fatal(err, r)
			}
			inst.Generation++
		}
	}
	all, more, err := s.History(ctx, "acme", a.ID, "", 100)
	if err != nil || more || len(all) != 4 {
		t.Fatalf("history: %d events, more %v, %v", len(all), more, err)
	}
	if all[0].Kind != instance.EventCreated || all[1].Kind != instance.EventUpdated || all[3].Instance.Generation != 4 || all[1].Changed[0] != "description" || all[0].Instance.ID != a.ID {
		t.Errorf("history %+v", all)
	}
	page, more, err := s.History(ctx, "acme", a.ID, "", 3)
	if err != nil || !more || len(page) != 3 {
		t.Fatalf("first page: %d, more %v, %v", len(page), more, err)
	}
	rest, more, err := s.History(ctx, "acme", a.ID, page[2].Cursor, 3)
	if err != nil || more || len(rest) != 1 || rest[0].Cursor != all[3].Cursor {
		t.Fatalf("after the page: %+v, more %v, %v", rest, more, err)
	}
	// Trim the log past the first page's cursor: resuming there could miss events.
	rdb.XTrimMaxLen(ctx, eventsKey("acme"), 2)
	if _, _, err := s.History(ctx, "acme", a.ID, page[0].Cursor, 3); !errors.Is(err, instance.ErrCursorExpired) {
		t.Errorf("after a trimmed cursor: %v, want ErrCursorExpired", err)
	}
	if got, _, err := s.History(ctx, "acme", a.ID, "", 10); err != nil || len(got) != 1 {
		t.Errorf("from the start after trimming: %d events, %v", len(got), err)
	}
}
