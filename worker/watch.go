package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/region"
)

// Watcher is the reverse edge: every server change in the region wakes the reconcile of the
// instance that owns the server, found through the reserved tag by direct lookup.
type Watcher struct {
	Region  region.Client
	Store   Store
	Queue   instance.Queue
	Logger  *slog.Logger
	Metrics *Metrics
}

// Start watches until ctx ends, starting from now. Events missed while no watcher ran are
// not replayed; the periodic resync covers them. Several workers may each run a watcher:
// the queue coalesces the duplicate wake-ups.
//
// Events are handled several at once (wakeParallel): each wake is two round trips, and one
// after another they fell behind a region building thousands of servers, so that every later
// event, however urgent, waited behind the backlog. Their order does not matter: a wake only
// adds the owner's key to the queue, which coalesces.
func (w *Watcher) Start(ctx context.Context) error {
	cursor := ""
	slot := make(chan struct{}, wakeParallel)
	var wakes sync.WaitGroup
	defer wakes.Wait()
	for ctx.Err() == nil {
		err := w.Region.Watch(ctx, cursor, func(ev region.Event) error {
			cursor = ev.Cursor
			select {
			case slot <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			}
			wakes.Go(func() {
				defer func() { <-slot }()
				w.wake(ctx, ev)
			})
			return nil
		})
		if err != nil && ctx.Err() == nil {
			w.Logger.WarnContext(ctx, "region watch failed; resuming", "err", err)
			sleep(ctx, time.Second)
		}
	}
	return nil
}

// wakeParallel is how many events one watcher handles at once.
const wakeParallel = 8

func (w *Watcher) wake(ctx context.Context, ev region.Event) {
	id := ev.Tags[region.InstanceTag]
	if id == "" {
		w.Metrics.orphanEvents.WithLabelValues("untagged").Inc()
		w.Logger.WarnContext(ctx, "server event without an instance tag", "server", ev.ServerID)
		return
	}
	org := ev.Scope.OrganizationID
	switch exists, err := w.Store.Exists(ctx, org, id); {
	case err != nil:
		w.Logger.WarnContext(ctx, "look up the owner of a server event", "server", ev.ServerID, "err", err)
	case !exists:
		// After a deprovision the server's last events outlive the instance; those are
		// expected, but they are counted like any other so a real orphan shows.
		w.Metrics.orphanEvents.WithLabelValues("unknown_instance").Inc()
		w.Logger.InfoContext(ctx, "server event for an unknown instance", "server", ev.ServerID, "instance", id, "kind", ev.Kind)
		return
	}
	if err := w.Queue.Enqueue(ctx, instance.Key(org, id)); err != nil {
		w.Logger.WarnContext(ctx, "enqueue the owner of a server event", "instance", id, "err", err)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
