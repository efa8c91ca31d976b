package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/instance"
)

// Seen is one event as a subscriber received it.
type Seen struct {
	Cursor     string    `json:"cursor"`
	Kind       string    `json:"kind"`
	OccurredAt time.Time `json:"occurredAt"`
	Instance   struct {
		ID        string `json:"id"`
		ProjectID string `json:"projectId"`
	} `json:"instance"`
}

const watchQuery = `subscription($org: ID!, $project: ID, $after: String) {
	instanceEvents(organizationId: $org, projectId: $project, after: $after) { cursor kind occurredAt instance { id projectId } } }`

// Watcher is one client following the events of a scope (an organization, or one of its
// projects) as a dashboard would: it subscribes with `after` set to a cursor, and whenever its
// subscription ends — its API went away, it fell behind, its connection was cut — it
// subscribes again after the cursor of the last event it received. Only the test's goroutine
// uses it.
type Watcher struct {
	// API is where it subscribes; a test may move it to another API.
	API          *harness.Process
	Token        string
	Org, Project string
	// Start is the cursor it first subscribed after.
	Start string

	subs    []*harness.Subscription
	decoded []int // per subscription, how many of its events are in seen
	seen    []Seen
	// Resumes counts the subscriptions after the first.
	Resumes int
}

func (w *Watcher) String() string {
	scope := w.Org
	if w.Project != "" {
		scope += "/" + w.Project
	}
	return "subscriber to " + scope + " on " + w.API.Name
}

// Subscribe starts a subscription after the last cursor received (Start at first).
func (w *Watcher) Subscribe(tb testing.TB) {
	tb.Helper()
	vars := map[string]any{"org": w.Org, "after": w.last(tb)}
	if w.Project != "" {
		vars["project"] = w.Project
	}
	if len(w.subs) > 0 {
		w.Resumes++
	}
	w.subs = append(w.subs, w.API.Subscribe(tb, w.Token, watchQuery, vars))
	w.decoded = append(w.decoded, 0)
}

// last returns the cursor of the last event received, or Start. It decodes that event only:
// resuming hundreds of subscribers must not wait for every event of each to be decoded.
func (w *Watcher) last(tb testing.TB) string {
	for i := len(w.subs) - 1; i >= 0; i-- {
		if events := w.subs[i].Events(); len(events) > 0 {
			return w.decode(tb, events[len(events)-1]).Cursor
		}
	}
	return w.Start
}

// Received returns every event received, over all its subscriptions, in order.
func (w *Watcher) Received(tb testing.TB) []Seen {
	tb.Helper()
	for i, sub := range w.subs {
		events := sub.Events()
		for _, raw := range events[w.decoded[i]:] {
			w.seen = append(w.seen, w.decode(tb, raw))
		}
		w.decoded[i] = len(events)
	}
	return w.seen
}

func (w *Watcher) decode(tb testing.TB, raw json.RawMessage) Seen {
	tb.Helper()
	var data struct {
		InstanceEvents Seen `json:"instanceEvents"`
	}
	if err := json.Unmarshal(raw, &data); err != nil {
		tb.Fatalf("%v: decode event %s: %v", w, raw, err)
	}
	return data.InstanceEvents
}

// Resume subscribes again after the last cursor received, once the current subscription
// has ended for a reason a client resumes from: the connection was lost (its API stopped, the
// network failed), or the server ended it as UNAVAILABLE (the subscriber fell behind, the
// feed stopped). Any other ending fails the test.
func (w *Watcher) Resume(tb testing.TB) {
	tb.Helper()
	ended, why := w.Ended()
	if !ended {
		tb.Fatalf("%v: resume while the subscription is open", w)
	}
	var refused harness.Errors
	if errors.As(why, &refused) {
		for _, e := range refused {
			if e.Code() != "UNAVAILABLE" {
				tb.Fatalf("%v: the subscription was ended with %v; a client cannot resume from that", w, why)
			}
		}
	}
	w.Subscribe(tb)
}

func (w *Watcher) current() *harness.Subscription { return w.subs[len(w.subs)-1] }

// Ended reports whether its current subscription ended, and why.
func (w *Watcher) Ended() (bool, error) { return w.current().Ended() }

// AwaitEnd waits until the current subscription ends, e.g. after its API was stopped.
func (w *Watcher) AwaitEnd(ctx context.Context) error {
	err := w.current().Wait(ctx, func([]json.RawMessage) bool { return false })
	if errors.Is(err, harness.ErrEnded) {
		return nil
	}
	return err
}

// CatchUp waits until it has received the event at cursor (or a later one), subscribing again
// whenever its subscription ends.
func (w *Watcher) CatchUp(ctx context.Context, tb testing.TB, cursor string) {
	tb.Helper()
	target := position(tb, cursor)
	reached := func(seen []Seen) bool {
		return len(seen) > 0 && !instance.PositionLess(position(tb, seen[len(seen)-1].Cursor), target)
	}
	for {
		// The condition is asked again each time events arrive; it decodes only the new ones.
		err := w.current().Wait(ctx, func([]json.RawMessage) bool { return reached(w.Received(tb)) })
		switch {
		case err == nil:
			return
		case errors.Is(err, harness.ErrEnded):
			w.Resume(tb)
		default:
			tb.Fatalf("%v: waiting for the event at %s (last received %s): %v", w, cursor, w.last(tb), err)
		}
	}
}

// position is the log position a cursor names.
func position(tb testing.TB, cursor string) string {
	tb.Helper()
	pos, err := instance.DecodeEventCursor(cursor)
	if err != nil {
		tb.Fatalf("chaos: %v", err)
	}
	return pos
}

// Expected returns the events of the log a subscriber to the scope after start must receive,
// in order.
func Expected(log []instance.Record, project, start string) ([]instance.Record, error) {
	after, err := instance.DecodeEventCursor(start)
	if err != nil {
		return nil, err
	}
	var out []instance.Record
	for _, rec := range log {
		if instance.PositionLess(after, rec.Cursor) && (project == "" || rec.Instance.ProjectID == project) {
			out = append(out, rec)
		}
	}
	return out, nil
}

// CheckReceived compares what a subscriber received with what it must have: every event of
// want, in order, once, and nothing else — except events that the log no longer holds because
// Redis lost them (lost reports whether a write at a time may have been), which a subscriber
// may have received before the loss. It returns the number of such lost events received.
func CheckReceived(got []Seen, want []instance.Record, lost func(time.Time) bool) (int, error) {
	inLog := map[string]bool{}
	for _, rec := range want {
		inLog[instance.EventCursor(rec)] = true
	}
	lostSeen, i, j := 0, 0, 0
	for i < len(got) && j < len(want) {
		g, w := got[i], want[j]
		switch cursor := instance.EventCursor(w); {
		case g.Cursor == cursor:
			if g.Kind != string(w.Kind) || g.Instance.ID != w.Instance.ID {
				return lostSeen, fmt.Errorf("event %d (%s) is %s of %s, the log has %s of %s", i, g.Cursor, g.Kind, g.Instance.ID, w.Kind, w.Instance.ID)
			}
			i, j = i+1, j+1
		case !inLog[g.Cursor] && lost != nil && lost(g.OccurredAt):
			lostSeen, i = lostSeen+1, i+1
		default:
			return lostSeen, fmt.Errorf("event %d is %s %s of %s at %s where the log's next is %s %s of %s at %s (%d received, %d in the log)",
				i, g.Cursor, g.Kind, g.Instance.ID, g.OccurredAt.Format(time.StampMilli), cursor, w.Kind, w.Instance.ID, w.At.Format(time.StampMilli), len(got), len(want))
		}
	}
	for ; i < len(got); i++ {
		if g := got[i]; inLog[g.Cursor] || lost == nil || !lost(g.OccurredAt) {
			return lostSeen, fmt.Errorf("event %d (%s %s of %s) is received after the log's last, or twice (%d received, %d in the log)", i, g.Cursor, g.Kind, g.Instance.ID, len(got), len(want))
		}
		lostSeen++
	}
	if j < len(want) {
		w := want[j]
		return lostSeen, fmt.Errorf("%d events of the log were never received, from %s %s of %s at %s on (%d received)",
			len(want)-j, instance.EventCursor(w), w.Kind, w.Instance.ID, w.At.Format(time.StampMilli), len(got))
	}
	return lostSeen, nil
}
