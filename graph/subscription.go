package graph

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/feed"
	"github.com/computeql/computeql/graph/model"
	"github.com/computeql/computeql/instance"
)

// subscribe serves the instanceEvents subscription: the current state of every matching
// instance as SNAPSHOT events in id order and then SYNCED (or, with after, every event since
// that cursor), then each change as it is committed. Only instances the subscriber may read
// are ever sent. after may also be a SNAPSHOT event's cursor: the snapshot then continues
// (instance.SnapshotCursor).
func (r *Resolver) subscribe(ctx context.Context, org, project, instanceID, after string, bookmarks bool) (<-chan *model.InstanceEvent, error) {
	pr, err := instance.Principal(ctx)
	if err != nil {
		return nil, err
	}
	if !pr.SeesOrganization(org) || project != "" && !pr.Allows(org, project, auth.RoleViewer) {
		if project == "" {
			return nil, instance.Errorf(instance.CodeNotFound, "organization %q not found", org)
		}
		return nil, instance.Errorf(instance.CodeNotFound, "project %q of organization %q not found", project, org)
	}
	// A watched instance must be readable and of the organization. Without after, the snapshot
	// reads it anyway once the subscription is live; with after, it is checked first.
	if instanceID != "" && after != "" {
		if _, err := r.watched(ctx, org, instanceID); err != nil {
			return nil, err
		}
	}
	pos, snapshotAfter := "", ""
	if after != "" {
		if pos, snapshotAfter, err = instance.DecodeSubscriptionCursor(after); err != nil {
			return nil, err
		}
	}
	resuming := snapshotAfter != ""          // a snapshot cut off after that instance
	shared, _ := auth.SharedFromContext(ctx) // what Principal read: the filter keeps it, not a copy
	match := func(rec *instance.Record) bool {
		i := rec.Instance
		return (project == "" || i.ProjectID == project) && shared.Allows(org, i.ProjectID, auth.RoleViewer)
	}
	st := &eventStream{ctx: ctx, end: endingOf(ctx), out: make(chan *model.InstanceEvent, 1), pos: pos, last: after, at: pos}
	delivery, pushed := ctx.Value(deliveryKey{}).(*Delivery)
	if pushed {
		st.wake = delivery.wake
	} else {
		st.wakeC = make(chan struct{}, 1)
		st.wake = func() {
			select {
			case st.wakeC <- struct{}{}:
			default:
			}
		}
	}
	sub, replay, err := r.Feed.SubscribeInstance(ctx, org, instanceID, pos, match, st.wake)
	if errors.Is(err, instance.ErrCursorExpired) {
		return nil, instance.Errorf(instance.CodeCursorExpired, "the event log no longer reaches back to that cursor: subscribe without it to start from a snapshot")
	}
	if err != nil {
		return nil, &instance.Error{Code: instance.CodeInternal, Message: "internal error", Err: err}
	}
	st.sub = sub
	var snapshot []*instance.Instance
	if after == "" || resuming {
		if snapshot, err = r.snapshot(ctx, org, project, instanceID, snapshotAfter); err != nil {
			sub.Close()
			return nil, err
		}
	}
	if resuming {
		// Replay first: the instances it updates were sent before the cut, and must catch up
		// to where the rest of the snapshot goes live. Of what changed since the cut-off
		// snapshot began, only the instances it had sent; the others come in the rest of the
		// snapshot, as they are now.
		for i := range replay {
			if rec := &replay[i]; rec.Instance.ID <= snapshotAfter {
				st.queue = append(st.queue, queued{toEvent(*rec), rec.Cursor})
			}
		}
		replay = nil
	}
	// The snapshot was read after the subscription went live, so a live event may be older
	// than an instance's snapshot; those are dropped, comparing versions.
	if len(snapshot) > 0 {
		st.seen = make([]seenVersion, 0, len(snapshot))
	}
	for _, inst := range snapshot {
		st.seen = append(st.seen, seenVersion{inst.ID, version{inst.Generation, inst.StatusVersion}})
		st.queue = append(st.queue, queued{&model.InstanceEvent{Cursor: instance.SnapshotCursor(sub.Start, inst.ID), Kind: instance.EventSnapshot,
			Instance: inst, ChangedFields: []string{}, OccurredAt: inst.UpdatedAt}, sub.Start})
	}
	if resuming || after == "" {
		st.queue = append(st.queue, queued{marker(instance.EventSynced, sub.Start), sub.Start})
	}
	for i := range replay {
		st.queue = append(st.queue, queued{toEvent(replay[i]), replay[i].Cursor})
	}
	// The subscription lives only as long as the token that opened it. A transport that
	// drives it wakes it at the deadline; otherwise a timer of its own does.
	if !pr.Deadline.IsZero() {
		st.deadline = pr.Deadline.UnixNano()
		if !pushed {
			st.expiry = time.AfterFunc(time.Until(pr.Deadline), func() { st.expired.Store(true); st.wake() })
		}
	}
	if bookmarks {
		every := r.BookmarkEvery
		// Created stopped, so that the callback never runs before st.bookmarks is set.
		st.bookmarks = time.AfterFunc(time.Duration(math.MaxInt64), func() {
			if st.stopped.Load() {
				return
			}
			st.bookmarkDue.Store(true)
			st.wake()
			st.bookmarks.Reset(every)
		})
		st.bookmarks.Reset(every)
	}
	forgetArguments(ctx)
	if pushed {
		delivery.st = st
	} else {
		go st.run()
	}
	return st.out, nil
}

// forgetArguments lets go of what the subscription was asked with once it has begun: gqlgen
// keeps its operation for the subscription's life, to run the selection on each event, and
// with it the field's arguments (read once, by the resolver) and the operation's coerced
// variables; with thousands of idle subscribers those maps are a large share of what each
// costs. The variables are kept when the selection below the field reads one (an argument, or
// @include and @skip), since each event's execution does.
func forgetArguments(ctx context.Context) {
	if !graphql.HasOperationContext(ctx) {
		return
	}
	fc := graphql.GetFieldContext(ctx)
	if fc == nil {
		return
	}
	fc.Args = nil
	if !usesVariables(fc.Field.Selections, map[string]bool{}) {
		graphql.GetOperationContext(ctx).Variables = nil
	}
}

// usesVariables reports whether anything in the selections reads a variable: the arguments
// and directives of fields, inline fragments and named fragments (each looked into once).
func usesVariables(set ast.SelectionSet, seen map[string]bool) bool {
	for _, sel := range set {
		switch s := sel.(type) {
		case *ast.Field:
			if argumentsUse(s.Arguments) || directivesUse(s.Directives) || usesVariables(s.SelectionSet, seen) {
				return true
			}
		case *ast.InlineFragment:
			if directivesUse(s.Directives) || usesVariables(s.SelectionSet, seen) {
				return true
			}
		case *ast.FragmentSpread:
			if directivesUse(s.Directives) || s.Definition == nil {
				return true // a fragment not resolved by validation: assume it does
			}
			if !seen[s.Name] {
				seen[s.Name] = true
				if directivesUse(s.Definition.Directives) || usesVariables(s.Definition.SelectionSet, seen) {
					return true
				}
			}
		}
	}
	return false
}

func directivesUse(ds ast.DirectiveList) bool {
	for _, d := range ds {
		if argumentsUse(d.Arguments) {
			return true
		}
	}
	return false
}

func argumentsUse(args ast.ArgumentList) bool {
	for _, a := range args {
		if valueUses(a.Value) {
			return true
		}
	}
	return false
}

func valueUses(v *ast.Value) bool {
	if v == nil {
		return false
	}
	if v.Kind == ast.Variable {
		return true
	}
	for _, c := range v.Children {
		if valueUses(c.Value) {
			return true
		}
	}
	return false
}

// Delivery lets a transport drive a subscription's events itself, instead of a goroutine per
// subscription waiting for them: with thousands of idle subscribers, that goroutine's stack is
// most of what each costs. The transport puts a Delivery in the operation's context
// (WithDelivery); the resolver then calls wake, which must return at once, whenever the next
// event may be ready, and the transport calls Next and, each time it returns true, the
// operation's response handler once, which then returns without waiting.
type Delivery struct {
	wake func()
	st   *eventStream
	// end is the operation's ending, for SubscriptionEndings: here rather than in a context
	// value of its own, one layer less for every subscription to keep.
	end ending
}

type deliveryKey struct{}

// WithDelivery returns a context whose subscription delivers through the returned Delivery,
// calling wake (which must not block) when its next event may be ready. The transport must
// also wake it once its principal's Deadline has passed (by the wall clock), when it ends:
// a transport holds one timer for all its subscriptions rather than one each.
func WithDelivery(ctx context.Context, wake func()) (context.Context, *Delivery) {
	d := &Delivery{wake: wake}
	return context.WithValue(ctx, deliveryKey{}, d), d
}

// Attached reports whether a subscription took the delivery: when not, the operation was
// not a subscription, or was refused, and its response handler is called as usual.
func (d *Delivery) Attached() bool { return d.st != nil }

// Next makes the next response ready: when it returns true, one call of the response handler
// returns it (or nil, at the end) without blocking; false means none is ready yet. After the
// end it keeps returning true.
func (d *Delivery) Next() bool { return d.st.push() }

// Stop releases what the subscription holds (its place in the feed, its timers); the
// transport calls it once the operation has ended, however it ended. Safe to call more than
// once, and alongside Next.
func (d *Delivery) Stop() {
	if d.st != nil {
		d.st.stop()
	}
}

// queued is an event the stream sends before the live ones, with the log position it
// stands for.
type queued struct {
	ev       *model.InstanceEvent
	position string
}

type version struct{ gen, sv int64 }

// seenVersion is an instance's version as the snapshot sent it. The snapshot is in id order,
// so a slice of them is searched like a map, at a fraction of a map's memory (most
// subscriptions watch one instance).
type seenVersion struct {
	id string
	v  version
}

// seenAt returns the version the snapshot sent of the instance.
func (st *eventStream) seenAt(id string) (version, bool) {
	i, ok := slices.BinarySearchFunc(st.seen, id, func(s seenVersion, id string) int { return strings.Compare(s.id, id) })
	if !ok {
		return version{}, false
	}
	return st.seen[i].v, true
}

// eventStream is one subscription's events, taken one at a time without blocking (poll):
// first the replay and snapshot it began with, then the feed's live events, bookmarks and the
// ending. Either a goroutine of its own (run) or a transport (through Delivery) drives it.
type eventStream struct {
	ctx   context.Context
	sub   *feed.Subscription
	end   *ending
	out   chan *model.InstanceEvent
	wake  func()
	wakeC chan struct{} // run's wake-ups; nil when a transport drives the stream

	queue []queued
	seen  []seenVersion // versions of the instances of the snapshot, in id order
	pos   string        // the cursor resumed from: live events up to it were seen
	// last is the cursor of the last event sent, at, the log position it stands for.
	last, at string

	expired, bookmarkDue, stopped atomic.Bool
	expiry, bookmarks             *time.Timer
	deadline                      int64 // the token's, in Unix nanoseconds; 0 for none

	// Only the driver (run, or the transport's calls of Next, one at a time) touches what
	// follows.
	ended, closed bool
	stopOnce      sync.Once
}

// poll returns the next event, or nil: then ended says whether the stream is over.
func (st *eventStream) poll() (ev *model.InstanceEvent, ended bool) {
	if st.ended || st.ctx.Err() != nil {
		st.ended = true
		return nil, true
	}
	if len(st.queue) > 0 {
		q := st.queue[0]
		st.queue[0] = queued{}
		if st.queue = st.queue[1:]; len(st.queue) == 0 {
			st.queue = nil
		}
		st.last, st.at = q.ev.Cursor, q.position
		return q.ev, false
	}
	if st.expired.Load() || st.deadline != 0 && time.Now().UnixNano() >= st.deadline {
		st.end.set(instance.CodeUnauthenticated, "the token of this subscription expired: subscribe again with a new token", st.last)
		st.ended = true
		return nil, true
	}
	for {
		rec, ok := st.sub.Next()
		if !ok {
			break
		}
		if v, ok := st.seenAt(rec.Instance.ID); ok && versioned(rec.Kind) && rec.Instance.Generation <= v.gen && rec.Instance.StatusVersion <= v.sv {
			continue
		}
		// Resuming on a process whose reader is behind the cursor: what the client has
		// already seen is not sent again.
		if st.pos != "" && !instance.PositionLess(st.pos, rec.Cursor) {
			continue
		}
		ev := toEvent(*rec)
		st.last, st.at = ev.Cursor, rec.Cursor
		return ev, false
	}
	if st.sub.Ended() {
		if err := st.sub.Err(); errors.Is(err, feed.ErrSlowConsumer) {
			st.end.set(instance.CodeUnavailable, "this subscription did not keep up with its events and was ended", st.last)
		} else if err != nil {
			st.end.set(instance.CodeUnavailable, "the event feed stopped", st.last)
		}
		st.ended = true
		return nil, true
	}
	// Read the position before looking at the buffer: the reader buffers every event up to it
	// first, so an empty buffer means none of them is left.
	if st.bookmarkDue.Swap(false) {
		if p := st.sub.Position(); instance.PositionLess(st.at, p) && st.sub.Buffered() == 0 {
			st.last, st.at = instance.EventCursor(instance.Record{Cursor: p}), p
			return marker(instance.EventBookmark, p), false
		}
	}
	return nil, false
}

// push is Delivery.Next.
func (st *eventStream) push() bool {
	ev, ended := st.poll()
	switch {
	case ev != nil:
		st.out <- ev // the handler took the previous one: there is room
		return true
	case ended:
		st.stop()
		if !st.closed {
			st.closed = true
			close(st.out)
		}
		return true
	}
	return false
}

// run drives the stream from a goroutine of its own, for transports that wait on the
// response handler.
func (st *eventStream) run() {
	defer close(st.out)
	defer st.stop()
	for {
		ev, ended := st.poll()
		switch {
		case ended:
			return
		case ev != nil:
			select {
			case st.out <- ev:
			case <-st.ctx.Done():
				return
			}
		default:
			select {
			case <-st.wakeC:
			case <-st.ctx.Done():
				return
			}
		}
	}
}

// stop releases the feed subscription and the timers.
func (st *eventStream) stop() {
	st.stopOnce.Do(func() {
		st.stopped.Store(true) // before Stop: a bookmark timer that fires meanwhile does not re-arm
		st.sub.Close()
		if st.expiry != nil {
			st.expiry.Stop()
		}
		if st.bookmarks != nil {
			st.bookmarks.Stop()
		}
	})
}

// marker is a SYNCED or BOOKMARK event at the position.
func marker(kind instance.EventKind, position string) *model.InstanceEvent {
	return &model.InstanceEvent{Cursor: instance.EventCursor(instance.Record{Cursor: position}), Kind: kind,
		ChangedFields: []string{}, OccurredAt: time.Now().UTC()}
}

// versioned reports whether an event of the kind changes the instance's versions (a warning
// or a deletion does not, and is never older than a snapshot).
func versioned(k instance.EventKind) bool {
	return k == instance.EventCreated || k == instance.EventUpdated || k == instance.EventStatusChanged || k == instance.EventRebuildStarted
}

// watched reads the instance a subscription watches: NOT_FOUND unless the subscriber may read
// it and it belongs to the organization subscribed to.
func (r *Resolver) watched(ctx context.Context, org, id string) (*instance.Instance, error) {
	inst, err := r.Service.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if inst.OrganizationID != org {
		return nil, instance.Errorf(instance.CodeNotFound, "instance %q not found", id)
	}
	return inst, nil
}

// snapshot lists every instance the subscription starts with, in id order after the
// instance with id after ("" for all): the one it watches (read after the subscription went
// live), or those of the organization or project.
func (r *Resolver) snapshot(ctx context.Context, org, project, instanceID, after string) ([]*instance.Instance, error) {
	if instanceID != "" {
		if after >= instanceID {
			return nil, nil
		}
		inst, err := r.watched(ctx, org, instanceID)
		if err != nil {
			return nil, err
		}
		return []*instance.Instance{inst}, nil
	}
	var out []*instance.Instance
	first := instance.MaxPageSize
	filter := &instance.Filter{}
	if project != "" {
		filter.ProjectID = &project
	}
	var cursor *string
	if after != "" {
		c := instance.Cursor(&instance.Instance{ID: after})
		cursor = &c
	}
	for {
		page, err := r.Service.List(ctx, instance.ListRequest{OrganizationID: org, Filter: filter, First: &first, After: cursor})
		if err != nil {
			return nil, err
		}
		out = append(out, page.Instances...)
		if !page.HasNextPage || len(page.Instances) == 0 {
			return out, nil
		}
		c := instance.Cursor(page.Instances[len(page.Instances)-1])
		cursor = &c
	}
}

func toEvent(rec instance.Record) *model.InstanceEvent {
	changed := rec.Changed
	if changed == nil {
		changed = []string{}
	}
	return &model.InstanceEvent{
		Cursor: instance.EventCursor(rec), Kind: rec.Kind, Instance: rec.Instance,
		ChangedFields: changed, OccurredAt: rec.At, Message: ptrIfSet(rec.Message),
		Actor: ptrIfSet(rec.Caller()), Action: ptrIfSet(rec.Action), Outcome: ptrIfSet(rec.Outcome),
	}
}

// A subscription that the server ends (its subscriber fell behind, its token expired) must
// tell the client why, with the cursor to resume after. gqlgen takes errors for a
// subscription only before its first event, so the reason travels from the resolver to
// SubscriptionEndings through the operation's context, and is sent as one last response
// before the stream completes.

type ending struct {
	mu  sync.Mutex
	err *gqlerror.Error
}

type endingKey struct{}

// endingOf returns the operation's ending, or a detached one outside SubscriptionEndings
// (then nobody reads it).
func endingOf(ctx context.Context) *ending {
	if e, ok := ctx.Value(endingKey{}).(*ending); ok {
		return e
	}
	if d, ok := ctx.Value(deliveryKey{}).(*Delivery); ok {
		return &d.end
	}
	return &ending{}
}

func (e *ending) set(code instance.Code, message, after string) {
	ext := map[string]any{"code": string(code)}
	if after != "" {
		ext["after"] = after
		message += "; resume with after: the cursor in extensions.after"
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.err = &gqlerror.Error{Message: message, Path: ast.Path{ast.PathName("instanceEvents")}, Extensions: ext}
}

// take returns the ending's error once.
func (e *ending) take() *gqlerror.Error {
	e.mu.Lock()
	defer e.mu.Unlock()
	err := e.err
	e.err = nil
	return err
}

// SubscriptionEndings is the handler extension that sends a subscription's ending reason.
type SubscriptionEndings struct{}

var (
	_ graphql.HandlerExtension     = SubscriptionEndings{}
	_ graphql.OperationInterceptor = SubscriptionEndings{}
)

// ExtensionName implements graphql.HandlerExtension.
func (SubscriptionEndings) ExtensionName() string { return "SubscriptionEndings" }

// Validate implements graphql.HandlerExtension.
func (SubscriptionEndings) Validate(graphql.ExecutableSchema) error { return nil }

// InterceptOperation implements graphql.OperationInterceptor.
func (SubscriptionEndings) InterceptOperation(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
	if op := graphql.GetOperationContext(ctx).Operation; op == nil || op.Operation != ast.Subscription {
		return next(ctx)
	}
	var end *ending
	if d, ok := ctx.Value(deliveryKey{}).(*Delivery); ok {
		end = &d.end
	} else {
		end = &ending{}
		ctx = context.WithValue(ctx, endingKey{}, end)
	}
	responses := next(ctx)
	return func(ctx context.Context) *graphql.Response {
		if resp := responses(ctx); resp != nil {
			return resp
		}
		if err := end.take(); err != nil {
			return &graphql.Response{Errors: gqlerror.List{err}}
		}
		return nil
	}
}
