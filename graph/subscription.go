package graph

import (
	"context"
	"errors"

	"github.com/99designs/gqlgen/graphql"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/graph/model"
	"github.com/computeql/computeql/instance"
)

// subscribe serves the instanceEvents subscription: the current state of every matching
// instance as SNAPSHOT events (or, with after, every event since that cursor), then each
// change as it is committed. Only instances the subscriber may read are ever sent.
func (r *Resolver) subscribe(ctx context.Context, org, project, instanceID, after string) (<-chan *model.InstanceEvent, error) {
	pr, err := instance.Principal(ctx)
	if err != nil {
		return nil, err
	}
	if !pr.SeesOrganization(org) || project != "" && !pr.Allows(org, project, auth.RoleViewer) {
		return nil, instance.Errorf(instance.CodeNotFound, "organization %q or project %q not found", org, project)
	}
	var only *instance.Instance
	if instanceID != "" {
		if only, err = r.Service.Get(ctx, instanceID); err != nil {
			return nil, err
		}
		if only.OrganizationID != org {
			return nil, instance.Errorf(instance.CodeNotFound, "instance %q not found", instanceID)
		}
	}
	pos := ""
	if after != "" {
		if pos, err = instance.DecodeEventCursor(after); err != nil {
			return nil, err
		}
	}
	match := func(rec *instance.Record) bool {
		i := rec.Instance
		return (project == "" || i.ProjectID == project) && (instanceID == "" || i.ID == instanceID) &&
			pr.Allows(org, i.ProjectID, auth.RoleViewer)
	}
	sub, replay, err := r.Feed.Subscribe(ctx, org, pos, match)
	if errors.Is(err, instance.ErrCursorExpired) {
		return nil, instance.Errorf(instance.CodeCursorExpired, "the event log no longer reaches back to that cursor: subscribe without it to start from a snapshot")
	}
	if err != nil {
		return nil, &instance.Error{Code: instance.CodeInternal, Message: "internal error", Err: err}
	}
	var snapshot []*instance.Instance
	if after == "" {
		if snapshot, err = r.snapshot(ctx, org, project, only); err != nil {
			sub.Close()
			return nil, err
		}
	}
	out := make(chan *model.InstanceEvent, 1)
	go func() {
		defer close(out)
		defer sub.Close()
		send := func(ev *model.InstanceEvent) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		// The snapshot was read after the subscription went live, so a live event may be
		// older than an instance's snapshot; those are dropped, comparing versions.
		type version struct{ gen, sv int64 }
		seen := map[string]version{}
		start := instance.EventCursor(instance.Record{Cursor: sub.Start})
		for _, inst := range snapshot {
			seen[inst.ID] = version{inst.Generation, inst.StatusVersion}
			if !send(&model.InstanceEvent{Cursor: start, Kind: instance.EventSnapshot, Instance: inst, ChangedFields: []string{}, OccurredAt: inst.UpdatedAt}) {
				return
			}
		}
		for _, rec := range replay {
			if !send(toEvent(rec)) {
				return
			}
		}
		for {
			select {
			case <-ctx.Done():
				return
			case rec, ok := <-sub.C():
				if !ok {
					if err := sub.Err(); err != nil {
						graphql.AddError(ctx, instance.Errorf(instance.CodeUnavailable, "%v", err))
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
				if !send(toEvent(*rec)) {
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

// snapshot lists every instance the subscription starts with: the one it watches (read after
// the subscription went live), or those of the organization or project.
func (r *Resolver) snapshot(ctx context.Context, org, project string, only *instance.Instance) ([]*instance.Instance, error) {
	if only != nil {
		inst, err := r.Service.Get(ctx, only.ID)
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
	var after *string
	for {
		page, err := r.Service.List(ctx, instance.ListRequest{OrganizationID: org, Filter: filter, First: &first, After: after})
		if err != nil {
			return nil, err
		}
		out = append(out, page.Instances...)
		if !page.HasNextPage || len(page.Instances) == 0 {
			return out, nil
		}
		c := instance.Cursor(page.Instances[len(page.Instances)-1])
		after = &c
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
