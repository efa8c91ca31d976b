package store

import (
	"encoding/json"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/computeql/computeql/instance"
)

// actionTime is when the verbs of these tests were called: later than the instance's
// UpdatedAt, so an event stamped with the wrong one shows.
var actionTime = time.Date(2026, 11, 21, 13, 0, 0, 0, time.UTC)

// lastRecord returns the newest event of the instance's history, decoded by decodeRecord.
func lastRecord(t *testing.T, s *Store, inst *instance.Instance) instance.Record {
	t.Helper()
	all, _, err := s.History(ctx, inst.OrganizationID, inst.ID, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 {
		t.Fatalf("instance %s has no history", inst.ID)
	}
	return all[len(all)-1]
}

// TestActWithoutChangesOnlyRecords: a verb that changed no desired state appends one ACTION
// event carrying who, which verb, its outcome and message, at the verb's time, and leaves
// every other key as it was; the decoded record returns them.
func TestActWithoutChangesOnlyRecords(t *testing.T) {
	tests := []struct {
		name string
		ev   instance.ActionEvent
	}{
		{"success", instance.ActionEvent{Actor: "otto", Action: instance.ActionReboot, Message: "The server is rebooting.", At: actionTime}},
		{"refused", instance.ActionEvent{Actor: "otto", Action: instance.ActionStop, Outcome: instance.CodeUnprocessable,
			Message: "stop server: cannot stop a server that is STOPPED.", At: actionTime}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb := redisServer.Client(t)
			s := New(rdb)
			inst := create(t, s, newInstance("acme", "web", "a"))
			instBefore := hgetall(t, rdb, instanceKey("acme", inst.ID))
			quotaBefore := hgetall(t, rdb, quotaKey("acme"))
			keysBefore := len(rdb.Keys(ctx, "*").Val())

			refusal, err := s.Act(ctx, inst, nil, tt.ev)
			if err != nil || refusal != nil {
				t.Fatalf("act: %+v, %v", refusal, err)
			}
			if h := hgetall(t, rdb, instanceKey("acme", inst.ID)); !reflect.DeepEqual(h, instBefore) {
				t.Errorf("instance changed:\n%v\n->\n%v", instBefore, h)
			}
			if q := hgetall(t, rdb, quotaKey("acme")); !reflect.DeepEqual(q, quotaBefore) {
				t.Errorf("quota changed: %v -> %v", quotaBefore, q)
			}
			if n := len(rdb.Keys(ctx, "*").Val()); n != keysBefore {
				t.Errorf("%d keys, want %d", n, keysBefore)
			}

			msgs := events(t, rdb, "acme")
			if len(msgs) != 2 {
				t.Fatalf("%d events, want CREATED and ACTION", len(msgs))
			}
			v := msgs[1].Values
			want := map[string]any{
				"kind": "ACTION", "id": inst.ID, "proj": "web", "gen": "1", "sv": "1", "changed": "",
				"at": strconv.FormatInt(actionTime.UnixMilli(), 10), "msg": tt.ev.Message,
				"actor": tt.ev.Actor, "action": string(tt.ev.Action), "outcome": string(tt.ev.Outcome),
			}
			for k, w := range want {
				if v[k] != w {
					t.Errorf("event field %s = %v, want %v", k, v[k], w)
				}
			}

			r := lastRecord(t, s, inst)
			if r.Kind != instance.EventAction || r.Actor != tt.ev.Actor || r.Action != tt.ev.Action || r.Outcome != tt.ev.Outcome ||
				r.Message != tt.ev.Message || !r.At.Equal(actionTime) || r.Changed != nil || r.Instance.Generation != 1 {
				t.Errorf("record %+v, want the ACTION as recorded", r)
			}
			if r.Caller() != tt.ev.Actor {
				t.Errorf("Caller() = %q, want the actor %q", r.Caller(), tt.ev.Actor)
			}
		})
	}
}

// TestActWithChangesWritesTheSpec: a verb that changed the desired state writes the spec
// compare-and-set on the generation, bumps it and records ACTION naming the fields, in one
// step; a stale generation or a vanished instance writes nothing at all.
func TestActWithChangesWritesTheSpec(t *testing.T) {
	ev := instance.ActionEvent{Actor: "otto", Action: instance.ActionStop, Message: "The server is stopping.", At: actionTime}
	tests := []struct {
		name   string
		exists bool
		gen    int64 // the generation the verb read
		want   *instance.Refusal
	}{
		{name: "current generation", exists: true, gen: 1},
		{name: "stale generation", exists: true, gen: 7, want: &instance.Refusal{Stale: true}},
		{name: "instance gone", gen: 1, want: &instance.Refusal{Gone: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb := redisServer.Client(t)
			s := New(rdb)
			inst := newInstance("acme", "web", "a")
			if tt.exists {
				inst = create(t, s, inst)
			}
			before := snapshot(t, rdb)
			next := *inst
			next.Generation = tt.gen
			next.Power = instance.IntentStopped

			refusal, err := s.Act(ctx, &next, []string{"desiredPowerState"}, ev)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(refusal, tt.want) {
				t.Fatalf("refusal = %+v, want %+v", refusal, tt.want)
			}
			if tt.want != nil {
				if after := snapshot(t, rdb); !reflect.DeepEqual(after, before) {
					t.Errorf("a refused act wrote:\n%v\n->\n%v", before, after)
				}
				return
			}

			h := hgetall(t, rdb, instanceKey("acme", inst.ID))
			if h["gen"] != "2" || h["sv"] != "1" {
				t.Errorf("gen/sv = %s/%s, want 2/1 (the status is not the verb's)", h["gen"], h["sv"])
			}
			var spec instance.Spec
			if err := json.Unmarshal([]byte(h["spec"]), &spec); err != nil || spec.Power != instance.IntentStopped {
				t.Errorf("spec %s (%v), want power STOPPED", h["spec"], err)
			}
			got, err := s.Get(ctx, []string{"acme"}, inst.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.DesiredPower() != instance.IntentStopped || got.Generation != 2 || got.Status.ProvisioningStatus != inst.Status.ProvisioningStatus {
				t.Errorf("stored %+v, want power STOPPED at generation 2 with the status untouched", got)
			}
			if q := hgetall(t, rdb, quotaKey("acme")); !reflect.DeepEqual(q, map[string]string{"used:servers": "1", "used:cpus": "2"}) {
				t.Errorf("quota = %v, want the create's charge only", q)
			}
			r := lastRecord(t, s, inst)
			if r.Kind != instance.EventAction || !reflect.DeepEqual(r.Changed, []string{"desiredPowerState"}) ||
				r.Actor != "otto" || r.Action != instance.ActionStop || r.Outcome != "" || r.Message != ev.Message ||
				!r.At.Equal(actionTime) || r.Instance.Generation != 2 || r.Instance.DesiredPower() != instance.IntentStopped {
				t.Errorf("record %+v (instance %+v), want the ACTION carrying the new spec", r, r.Instance.Spec)
			}
			if n := len(events(t, rdb, "acme")); n != 2 {
				t.Errorf("%d events, want CREATED and ACTION", n)
			}
		})
	}
}

// TestActOnAVanishedInstanceRecordsNothing: recording a verb on an instance that is gone (it
// was forgotten between the verb's read and its record) is Refusal.Gone and writes nothing.
func TestActOnAVanishedInstanceRecordsNothing(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	inst := create(t, s, newInstance("acme", "web", "a"))
	if ok, err := s.Forget(ctx, inst, eventTime); err != nil || !ok {
		t.Fatal(err, ok)
	}
	before := snapshot(t, rdb)
	ev := instance.ActionEvent{Actor: "otto", Action: instance.ActionConsole, At: actionTime}
	refusal, err := s.Act(ctx, inst, nil, ev)
	if err != nil || refusal == nil || !refusal.Gone {
		t.Fatalf("act on a forgotten instance: %+v, %v; want Refusal.Gone", refusal, err)
	}
	if after := snapshot(t, rdb); !reflect.DeepEqual(after, before) {
		t.Errorf("recorded on a forgotten instance:\n%v\n->\n%v", before, after)
	}
}

// TestWarnRecordsNoActor: a warning, recorded by the same script as actions, carries its
// message and none of an action's fields.
func TestWarnRecordsNoActor(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	inst := create(t, s, newInstance("acme", "web", "a"))
	if ok, err := s.Warn(ctx, inst, eventTime, "duplicates deleted"); err != nil || !ok {
		t.Fatal(err, ok)
	}
	msgs := events(t, rdb, "acme")
	if len(msgs) != 2 {
		t.Fatalf("%d events, want CREATED and WARNING", len(msgs))
	}
	for _, k := range []string{"actor", "action", "outcome"} {
		if v, ok := msgs[1].Values[k]; ok {
			t.Errorf("warning carries %s = %v", k, v)
		}
	}
	r := lastRecord(t, s, inst)
	if r.Kind != instance.EventWarning || r.Message != "duplicates deleted" || !r.At.Equal(eventTime) ||
		r.Actor != "" || r.Action != "" || r.Outcome != "" || r.Caller() != "" {
		t.Errorf("warning record %+v", r)
	}
}
