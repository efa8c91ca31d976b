package worker_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/instance"
)

// history returns the events of one instance from its organization's event stream, read raw:
// the stream is what the subscriptions will serve.
func (e *env) history(t *testing.T, inst *instance.Instance) []redis.XMessage {
	t.Helper()
	msgs, err := e.rdb.XRange(bg, "cq:{o:"+inst.OrganizationID+"}:events", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(msgs, func(m redis.XMessage) bool { return m.Values["id"] != inst.ID })
}

func kinds(msgs []redis.XMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i], _ = m.Values["kind"].(string)
	}
	return out
}

// TestHistoryRecordsEachVisibleChangeOnce: a status event is recorded only
// when something changed: every STATUS_CHANGED event names what, no two consecutive ones carry
// the same status, and a reconcile that finds nothing new records nothing.
func TestHistoryRecordsEachVisibleChangeOnce(t *testing.T) {
	e := newEnv(t)
	inst := e.waitRunning(t, e.create(t, "web-1").ID)
	h := e.history(t, inst)
	if k := kinds(h); len(k) < 3 || k[0] != "CREATED" || slices.ContainsFunc(k[1:], func(s string) bool { return s != "STATUS_CHANGED" }) {
		t.Fatalf("history %v, want CREATED then STATUS_CHANGED events", k)
	}
	for i, m := range h[1:] {
		if m.Values["changed"] == "" {
			t.Errorf("status event %d names no change", i+1)
		}
		if i > 0 && m.Values["status"] == h[i].Values["status"] {
			t.Errorf("status events %d and %d carry the same status", i, i+1)
		}
	}
	var last instance.Status
	if err := json.Unmarshal([]byte(h[len(h)-1].Values["status"].(string)), &last); err != nil || last.PowerState != instance.PowerRunning {
		t.Errorf("the last event's status is %+v (%v), want RUNNING", last, err)
	}

	// Reconciling an instance that is as it should be records nothing.
	before := len(h)
	for range 3 {
		if err := e.q.Enqueue(bg, inst.Key()); err != nil {
			t.Fatal(err)
		}
		eventually.Holds(t, convergeLimit, func() bool {
			waiting, err := e.q.Waiting(bg, inst.Key())
			return err == nil && !waiting
		}, "the reconcile done")
	}
	if n := len(e.history(t, inst)); n != before {
		t.Errorf("%d events after reconciles that found nothing new, want %d", n, before)
	}
}

// TestHistoryOfARebuildAndADeletion: the rebuild is recorded once as REBUILD_STARTED, naming
// the status fields it changed; the deletion request as UPDATED naming deletedAt; and the
// teardown ends the history with DELETED, carrying the instance as it was.
func TestHistoryOfARebuildAndADeletion(t *testing.T) {
	e := newEnv(t, func(s *setup) { s.sim.DeleteDelay = 50 * time.Millisecond })
	inst := e.waitRunning(t, e.create(t, "web-1").ID)
	updated := e.update(t, instance.UpdateRequest{ID: inst.ID, FlavorID: ptr("g1.medium"), AllowRebuild: true})
	eventually.Holds(t, convergeLimit, func() bool {
		got := e.get(t, inst.ID)
		return converged(got) && got.Status.ObservedGeneration == updated.Generation
	}, "the rebuild done")
	k := kinds(e.history(t, inst))
	if n := count(k, "REBUILD_STARTED"); n != 1 {
		t.Errorf("history %v: %d REBUILD_STARTED, want 1", k, n)
	}
	if i, j := slices.Index(k, "UPDATED"), slices.Index(k, "REBUILD_STARTED"); i < 0 || j < i {
		t.Errorf("history %v: want the UPDATED (flavor) before REBUILD_STARTED", k)
	}

	if _, err := e.svc.Delete(admin, inst.ID, nil); err != nil {
		t.Fatal(err)
	}
	e.waitGone(t, inst.ID)
	h := e.history(t, inst)
	k = kinds(h)
	if k[len(k)-1] != "DELETED" {
		t.Fatalf("history %v, want DELETED last", k)
	}
	deletion := slices.IndexFunc(h, func(m redis.XMessage) bool { return m.Values["kind"] == "UPDATED" && m.Values["changed"] != "flavorId" })
	if deletion < 0 || !slices.Contains([]string{"deletedAt,status.provisioningStatus,status.conditions"}, h[deletion].Values["changed"].(string)) {
		t.Errorf("no UPDATED event for the deletion request naming deletedAt: %v", h)
	}
	var spec instance.Spec
	if err := json.Unmarshal([]byte(h[len(h)-1].Values["spec"].(string)), &spec); err != nil || spec.DeletedAt == nil || spec.FlavorID != "g1.medium" {
		t.Errorf("DELETED carries %v (%v)", h[len(h)-1].Values["spec"], err)
	}
}

// TestDuplicateServersAreRecordedAsAWarning: the extra servers are deleted and
// the history says so.
func TestDuplicateServersAreRecordedAsAWarning(t *testing.T) {
	e := newEnv(t, func(s *setup) { s.sim.Faults.DuplicateCreates = true })
	inst := e.waitRunning(t, e.create(t, "web-1").ID)
	h := e.history(t, inst)
	w := slices.IndexFunc(h, func(m redis.XMessage) bool { return m.Values["kind"] == "WARNING" })
	if w < 0 || h[w].Values["msg"] == "" {
		t.Errorf("history %v has no WARNING with a message", kinds(h))
	}
}

func count(list []string, s string) int {
	n := 0
	for _, v := range list {
		if v == s {
			n++
		}
	}
	return n
}
