package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/region"
)

// Resync periodically puts back on the queue the instances whose work may have been lost (a
// crash between a store write and its enqueue, a missed server event): those whose observed
// generation lags, that are deleting, or that are still provisioning. Every DriftEvery-th
// pass it enqueues every instance, so a server changed or deleted behind our back is found.
type Resync struct {
	Store         Store
	Queue         instance.Queue
	Organizations func() []string
	// Interval defaults to 30s.
	Interval time.Duration
	// DriftEvery defaults to 10 (every 5 minutes with the default interval).
	DriftEvery int
	// Servers lists every server of the regions, for the collection of orphans on every
	// drift pass: servers whose instance does not exist. Defaults to none: no collection.
	Servers func(context.Context) ([]region.Server, error)
	// Region deletes the orphans.
	Region  region.Client
	Logger  *slog.Logger
	Metrics *Metrics
}

// Start runs a pass now and then every Interval until ctx ends.
func (r *Resync) Start(ctx context.Context) error {
	if r.Interval <= 0 {
		r.Interval = 30 * time.Second
	}
	if r.DriftEvery <= 0 {
		r.DriftEvery = 10
	}
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for pass := 0; ; pass++ {
		drift := pass%r.DriftEvery == 0
		r.Pass(ctx, drift)
		if drift {
			r.Collect(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Pass enqueues the instances that need it (every instance when all is true). As it reads
// every instance anyway, it also counts them by provisioning status for the instances gauge,
// set for an organization once all of it was read.
func (r *Resync) Pass(ctx context.Context, all bool) {
	for _, org := range r.Organizations() {
		counts := map[instance.ProvisioningStatus]int{}
		for after := ""; ctx.Err() == nil; {
			batch, err := r.Store.List(ctx, org, "", after, 500)
			if err != nil {
				r.Logger.WarnContext(ctx, "resync: list instances", "org", org, "err", err)
				counts = nil
				break
			}
			for _, inst := range batch {
				counts[inst.Status.ProvisioningStatus]++
				if all || unsettled(inst) {
					if err := r.Queue.Enqueue(ctx, inst.Key()); err != nil {
						r.Logger.WarnContext(ctx, "resync: enqueue", "instance", inst.ID, "err", err)
						continue
					}
					r.Metrics.resyncQueued.Inc()
				}
			}
			if len(batch) < 500 {
				if counts != nil {
					r.Metrics.countInstances(org, counts)
				}
				break
			}
			after = batch[len(batch)-1].ID
		}
	}
}

func unsettled(i *instance.Instance) bool {
	return i.Deleting() || i.Status.ObservedGeneration < i.Generation || i.Status.Building()
}

// Collect deletes the servers whose instance does not exist: left behind by a worker killed
// between making a server and recording it, or by a store restored from an older copy. It is
// safe because an instance is stored before its first reconcile makes a server, and forgotten
// only after its servers are gone. Servers without the instance tag are not computeql's to
// delete and are left alone.
func (r *Resync) Collect(ctx context.Context) {
	if r.Servers == nil {
		return
	}
	servers, err := r.Servers(ctx)
	if err != nil {
		// What could be listed is still collected: one unreachable region hides no other.
		r.Logger.WarnContext(ctx, "collect orphans: list servers", "err", err)
	}
	for _, srv := range servers {
		id := srv.Tags[region.InstanceTag]
		if id == "" || srv.State == region.ServerDeleting {
			continue
		}
		switch exists, err := r.Store.Exists(ctx, srv.OrganizationID, id); {
		case err != nil:
			r.Logger.WarnContext(ctx, "collect orphans: look up the owner", "server", srv.ID, "err", err)
		case !exists:
			if err := r.Region.DeleteServer(ctx, srv.ID); err != nil {
				r.Logger.WarnContext(ctx, "collect orphans: delete", "server", srv.ID, "err", err)
				continue
			}
			r.Metrics.orphansDeleted.Inc()
			r.Logger.WarnContext(ctx, "orphaned server deleted", "server", srv.ID, "instance", id, "org", srv.OrganizationID)
		}
	}
}
