package chaos

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/instance"
)

// logOf returns a log of n events, alternating between two projects, a second apart.
func logOf(n int) []instance.Record {
	var log []instance.Record
	for i := range n {
		project := []string{"web", "data"}[i%2]
		inst := &instance.Instance{ID: "i" + strconv.Itoa(i%3), OrganizationID: "acme", ProjectID: project}
		log = append(log, instance.Record{Cursor: strconv.Itoa(1000+i) + "-0", Kind: instance.EventStatusChanged, Instance: inst, At: t0.Add(time.Duration(i) * time.Second)})
	}
	return log
}

// seenOf is what a subscriber receives of the records.
func seenOf(recs []instance.Record) []Seen {
	out := make([]Seen, len(recs))
	for i, r := range recs {
		out[i] = Seen{Cursor: instance.EventCursor(r), Kind: string(r.Kind), OccurredAt: r.At}
		out[i].Instance.ID, out[i].Instance.ProjectID = r.Instance.ID, r.Instance.ProjectID
	}
	return out
}

func TestExpected(t *testing.T) {
	log := logOf(6)
	got, err := Expected(log, "web", instance.EventCursor(log[1]))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Cursor != log[2].Cursor || got[1].Cursor != log[4].Cursor {
		t.Fatalf("the web events after the second: %v", got)
	}
	if _, err := Expected(log, "", "not a cursor"); err == nil {
		t.Fatal("a malformed start cursor was accepted")
	}
}

func TestCheckReceived(t *testing.T) {
	log := logOf(5)
	// lost is a Redis loss at t0+10s: events received at or just before it may be gone.
	lostEvent := seenOf([]instance.Record{{Cursor: "1009-0", Kind: instance.EventUpdated, Instance: &instance.Instance{ID: "i1"}, At: t0.Add(9 * time.Second)}})[0]
	lost := func(at time.Time) bool { return !at.Before(t0.Add(8*time.Second)) && !at.After(t0.Add(10*time.Second)) }
	all := seenOf(log)
	for _, tc := range []struct {
		name string
		got  []Seen
		lost func(time.Time) bool
		want string // "" for no violation
	}{
		{"every event, in order, once", all, nil, ""},
		{"one missed", append(append([]Seen{}, all[:2]...), all[3:]...), nil, "event 2 is"},
		{"the last missed", all[:4], nil, "1 events of the log were never received"},
		{"one twice", append(append([]Seen{}, all[:3]...), all[2:]...), nil, "event 3 is"},
		{"one twice at the end", append(append([]Seen{}, all...), all[4]), nil, "received after the log's last, or twice"},
		{"two swapped", []Seen{all[0], all[2], all[1], all[3], all[4]}, nil, "event 1 is"},
		{"wrong kind", func() []Seen { g := append([]Seen{}, all...); g[1].Kind = "DELETED"; return g }(), nil, "event 1 (" + all[1].Cursor + ") is DELETED"},
		{"an event Redis lost, seen before the loss", append(append([]Seen{}, all...), lostEvent), lost, ""},
		{"an event the log lacks, outside the loss", append(append([]Seen{}, all...), lostEvent), func(time.Time) bool { return false }, "received after the log's last"},
		{"an event the log lacks, no loss possible", append(append([]Seen{}, all[:2]...), append([]Seen{lostEvent}, all[2:]...)...), nil, "event 2 is"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CheckReceived(tc.got, log, tc.lost)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
