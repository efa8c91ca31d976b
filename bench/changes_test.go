package bench

import (
	"context"
	"testing"
	"time"
)

func TestChangesMatch(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type seen struct {
		health string
		at     time.Duration // after t0
		want   time.Duration // latency matched; -1 for no match
	}
	tests := []struct {
		name    string
		changes []time.Duration // when changes 0, 1, ... of the instance were made, after t0
		events  []seen
	}{
		{"each change in turn", []time.Duration{0, 10 * time.Millisecond}, []seen{
			{"DEGRADED", 2 * time.Millisecond, 2 * time.Millisecond},
			{"HEALTHY", 13 * time.Millisecond, 3 * time.Millisecond},
		}},
		{"an event before any change is none of them", nil, []seen{{"HEALTHY", 0, -1}, {"DEGRADED", 0, -1}}},
		{"an unchanged health is not the next change", []time.Duration{0}, []seen{
			{"HEALTHY", time.Millisecond, -1},
			{"DEGRADED", 4 * time.Millisecond, 4 * time.Millisecond},
		}},
		{"a repeat of the same health matches once", []time.Duration{0}, []seen{
			{"DEGRADED", time.Millisecond, time.Millisecond},
			{"DEGRADED", 2 * time.Millisecond, -1},
		}},
		{"a change not yet made is not matched", []time.Duration{0}, []seen{
			{"DEGRADED", time.Millisecond, time.Millisecond},
			{"HEALTHY", 2 * time.Millisecond, -1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch := newChanges()
			for i, at := range tt.changes {
				if k := ch.record("i1", t0.Add(at)); k != i {
					t.Fatalf("record returned %d, want %d", k, i)
				}
			}
			next := 0
			for i, ev := range tt.events {
				d, ok := ch.match("i1", &next, ev.health, t0.Add(ev.at))
				if ev.want < 0 && ok || ev.want >= 0 && (!ok || d != ev.want) {
					t.Errorf("event %d (%s): match = %v, %v; want %v", i, ev.health, d, ok, ev.want)
				}
			}
		})
	}
}

// Receivers follow from the changes made when they start, each on its own.
func TestReceivers(t *testing.T) {
	t0 := time.Now()
	ch := newChanges()
	ch.record("a", t0) // change 0, DEGRADED: before either receiver
	tl := newTally()
	early := newReceiver(ch, tl, "a")
	ch.record("a", t0.Add(time.Millisecond)) // change 1, HEALTHY
	late := newReceiver(ch, tl, "a", "b")
	ch.record("b", t0.Add(2*time.Millisecond)) // change 0 of b, DEGRADED

	at := t0.Add(5 * time.Millisecond)
	early.see("a", "DEGRADED", at) // change 0 came before it started
	early.see("a", "HEALTHY", at)
	late.see("a", "HEALTHY", at) // change 1 came before it started
	late.see("b", "DEGRADED", at)
	late.see("c", "DEGRADED", at) // not followed
	if got := early.latencies(); len(got) != 1 || got[0] != 4*time.Millisecond {
		t.Errorf("early receiver = %v, want [4ms]", got)
	}
	if got := late.latencies(); len(got) != 1 || got[0] != 3*time.Millisecond {
		t.Errorf("late receiver = %v, want [3ms]", got)
	}
	if got, _ := tl.counts(); got != 2 {
		t.Errorf("tally counted %d receipts, want 2", got)
	}
}

func TestTally(t *testing.T) {
	tests := []struct {
		name        string
		expect, got int
		seal        bool
		wantMissing int
		wantAll     bool
	}{
		{"all in after the seal", 3, 3, true, 0, true},
		{"all in but not sealed: more may be expected", 3, 3, false, 0, false},
		{"some missing", 3, 1, true, 2, false},
		{"nothing expected", 0, 0, true, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tl := newTally()
			tl.expect(tt.expect)
			for range tt.got {
				tl.receive()
			}
			if tt.seal {
				tl.seal()
			}
			all := false
			select {
			case <-tl.all:
				all = true
			default:
			}
			if all != tt.wantAll {
				t.Errorf("all done = %v, want %v", all, tt.wantAll)
			}
			// Aborted at once; what is missing is counted either way.
			closed := make(chan struct{})
			close(closed)
			if m := tl.wait(context.Background(), time.Hour, closed); m != tt.wantMissing {
				t.Errorf("missing = %d, want %d", m, tt.wantMissing)
			}
		})
	}
}

// Receipts may come before they are expected (a commit seen before the create returned its
// id); the tally is done only once sealed with everything in.
func TestTallyReceiptsBeforeExpectations(t *testing.T) {
	tl := newTally()
	tl.receive()
	tl.expect(1)
	tl.expect(1)
	tl.seal()
	select {
	case <-tl.all:
		t.Fatal("done with one of two receipts")
	default:
	}
	tl.receive()
	select {
	case <-tl.all:
	default:
		t.Fatal("not done with both receipts")
	}
}
