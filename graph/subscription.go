package graph

import (
	"context"
	"errors"
	"sync"
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
	resuming := snapshotAfter != "" // a snapshot cut off after that instance
	match := func(rec *instance.Record) bool {
		i := rec.Instance
		return (project == "" || i.ProjectID == project) && pr.Allows(org, i.ProjectID, auth.RoleViewer)
	}
	sub, replay, err := r.Feed.SubscribeInstance(ctx, org, instanceID, pos, match)
	if errors.Is(err, instance.ErrCursorExpired) {
		return nil, instance.Errorf(instance.CodeCursorExpired, "the event log no longer reaches back to that cursor: subscribe without it to start from a snapshot")
	}
	if err != nil {
		return nil, &instance.Error{Code: instance.CodeInternal, Message: "internal error", Err: err}
	}
	var snapshot []*instance.Instance
	if after == "" || resuming {
		if snapshot, err = r.snapshot(ctx, org, project, instanceID, snapshotAfter); err != nil {
			sub.Close()
			return nil, err
		}
	}
	if resuming {
		// What changed since the cut-off snapshot began, of the instances it had sent; the
		// others come in the rest of the snapshot, as they are now.
		sent := replay[:0:0]
		for _, rec := range replay {
			if rec.Instance.ID <= snapshotAfter {
				sent = append(sent, rec)
			}
		}
		replay = sent
	}
	end := endingOf(ctx)
	out := make(chan *model.InstanceEvent, 1)
	go func() {
		defer close(out)
		defer sub.Close()
		// The subscription lives only as long as the token that opened it.
		var expired <-chan time.Time
		if !pr.Deadline.IsZero() {
			timer := time.NewTimer(time.Until(pr.Deadline))
			defer timer.Stop()
			expired = timer.C
		}
		var bookmark <-chan time.Time
		if bookmarks {
			tick := time.NewTicker(r.BookmarkEvery)
			defer tick.Stop()
			bookmark = tick.C
		}
		// last is the cursor of the last event sent, at, the log position it stands for.
		last, at := after, pos
		send := func(ev *model.InstanceEvent, position string) bool {
			select {
			case out <- ev:
				last, at = ev.Cursor, position
				return true
			case <-ctx.Done():
				return false
			}
		}
		sendRecord := func(rec *instance.Record) bool { return send(toEvent(*rec), rec.Cursor) }
		marker := func(kind instance.EventKind, position string) bool {
			return send(&model.InstanceEvent{Cursor: instance.EventCursor(instance.Record{Cursor: position}), Kind: kind,
				ChangedFields: []string{}, OccurredAt: time.Now().UTC()}, position)
		}
		if resuming {
			// Replay first: the instances it updates were sent before the cut, and must catch up
			// to where the rest of the snapshot goes live.
			for i := range replay {
				if !sendRecord(&replay[i]) {
					return
				}
			}
			replay = nil
		}
		// The snapshot was read after the subscription went live, so a live event may be
		// older than an instance's snapshot; those are dropped, comparing versions.
		type version struct{ gen, sv int64 }
		seen := map[string]version{}
		for _, inst := range snapshot {
			seen[inst.ID] = version{inst.Generation, inst.StatusVersion}
			ev := &model.InstanceEvent{Cursor: instance.SnapshotCursor(sub.Start, inst.ID), Kind: instance.EventSnapshot,
				Instance: inst, ChangedFields: []string{}, OccurredAt: inst.UpdatedAt}
			if !send(ev, sub.Start) {
				return
			}
		}
		if resuming || after == "" {
			if !marker(instance.EventSynced, sub.Start) {
				return
			}
		}
		for i := range replay {
			if !sendRecord(&replay[i]) {
				return
			}
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-expired:
				end.set(instance.CodeUnauthenticated, "the token of this subscription expired: subscribe again with a new token", last)
				return
			case <-bookmark:
				// Read the position before looking at the buffer: the reader puts every event up
				// to it in the buffer first, so an empty buffer means none of them is left.
				if p := sub.Position(); instance.PositionLess(at, p) && len(sub.C()) == 0 {
					if !marker(instance.EventBookmark, p) {
						return
					}
				}
			case rec, ok := <-sub.C():
				if !ok {
					if err := sub.Err(); errors.Is(err, feed.ErrSlowConsumer) {
						end.set(instance.CodeUnavailable, "this subscription did not keep up with its events and was ended", last)
					} else if err != nil {
						end.set(instance.CodeUnavailable, "the event feed stopped", last)
					}
					return
				}
				if v, ok := seen[rec.Instance.ID]; ok && versioned(rec.Kind) && rec.Instance.Generation <= v.gen && rec.Instance.StatusVersion <= v.sv {
					continue
				}
				// Resuming on a process whose reader is behind the cursor: what the client has
				// already seen is not sent again.
				if pos != "" && !instance.PositionLess(pos, rec.Cursor) {
					continue
				}
				if !sendRecord(rec) {
					return
				}
			}
		}
	}()
	return out, nil
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
	end := &ending{}
	responses := next(context.WithValue(ctx, endingKey{}, end))
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
