// Package worker realises instances: a reconciler that closes the gap between each instance
// and its backing server, a watcher that turns region server events into reconciles of their
// owners, and a periodic resync that heals lost work. Workers talk to the region only through
// region.Client and to instances only through the store.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/region"
)

// Store is what workers need of the instance store.
type Store interface {
	Get(ctx context.Context, orgs []string, id string) (*instance.Instance, error)
	// Exists reports whether the instance exists, without reading it.
	Exists(ctx context.Context, org, id string) (bool, error)
	List(ctx context.Context, org, project, after string, limit int) ([]*instance.Instance, error)
	// WriteStatus writes the status if the status version is still the instance's, with the
	// event for its history.
	WriteStatus(ctx context.Context, inst *instance.Instance, status instance.Status, ev instance.Event) (bool, error)
	// Forget releases the quota, frees the name and removes the instance, if its generation
	// is still the instance's, recording its deletion.
	Forget(ctx context.Context, inst *instance.Instance, at time.Time) (bool, error)
	// Warn records a warning on the instance's history.
	Warn(ctx context.Context, inst *instance.Instance, at time.Time, message string) (bool, error)
	// UpdateSpec writes a spec (and status) change; workers use it only to delete an instance
	// whose network was deleted.
	UpdateSpec(ctx context.Context, inst *instance.Instance, delta, limits quota.Amounts, status *instance.Status, changed []string, idem instance.Idempotency) (*instance.Refusal, error)
	// Act records an ACTION, with the spec change it makes (the end of a lease).
	Act(ctx context.Context, inst *instance.Instance, changed []string, ev instance.ActionEvent) (*instance.Refusal, error)
}

// Reconciler reconciles one instance per call; it is the work queue's handler. It is
// level-based and idempotent: the queue carries only the key, and the reconciler reads the
// desired state and the server afresh, so reconciling the same state twice is harmless.
//
// Returning a delay means poll (the region is still working); returning an error means back
// off and retry; the queue dead-letters a key that keeps failing, and OnDeadLetter marks it.
type Reconciler struct {
	Store  Store
	Region region.Client
	// NetworkExists says whether a network is still in the region's catalogue: the instances of
	// a deleted network are deleted with it.
	NetworkExists func(id string) bool
	// Yield is how soon to look again while the region is still working. The region's server
	// events usually wake the instance earlier. Defaults to 1s.
	Yield time.Duration
	// CapacityRetry is how soon to try again to create a server the region had no room for.
	CapacityRetry time.Duration
	// UnreachableRetry is how soon to look again at an instance whose region's host cannot be
	// reached. The host's return usually wakes it earlier: the region then reports every
	// server again.
	UnreachableRetry time.Duration
	Logger           *slog.Logger
	Now              func() time.Time
	Metrics          *Metrics
}

// SplitKey parses a work-queue key made by instance.Key.
func SplitKey(key string) (org, id string, err error) {
	org, id, ok := strings.Cut(key, "/")
	if !ok || org == "" || id == "" {
		return "", "", queue.Terminal(fmt.Errorf("malformed instance key %q", key))
	}
	return org, id, nil
}

// Handle implements queue.Handler.
func (r *Reconciler) Handle(ctx context.Context, t queue.Task) (time.Duration, error) {
	org, id, err := SplitKey(t.Key)
	if err != nil {
		return 0, err
	}
	inst, err := r.Store.Get(ctx, []string{org}, id)
	if errors.Is(err, instance.ErrNotFound) {
		return 0, nil // forgotten: nothing to do
	}
	if err != nil {
		return 0, fmt.Errorf("reconcile %s: %w", t.Key, err)
	}
	start := time.Now()
	again, err := r.reconcile(ctx, inst)
	took := time.Since(start)
	r.Metrics.reconciled(err, took)
	if errors.Is(err, region.ErrUnreachable) {
		// Not a failure of this instance: it is not counted towards dead-lettering, and
		// nothing is decided (deleted, recreated, marked ERROR) from the host's silence.
		r.Logger.WarnContext(ctx, "region host unreachable", "instance", inst.ID, "org", org, "region", inst.RegionID, "err", err)
		msg := "The host of region " + inst.RegionID + " cannot be reached. The last known state is shown; reconciling resumes when the host is back."
		if host := (region.HostUnreachable{}); errors.As(err, &host) {
			msg = "Host " + host.Host + " of region " + inst.RegionID + ", which may hold this instance's server, cannot be reached. " +
				"The last known state is shown; reconciling resumes when the host is back."
		}
		_, werr := r.writeStatus(ctx, inst, inst.Unreachable(msg, r.Now()), instance.EventStatusChanged)
		return r.UnreachableRetry, werr
	}
	if err != nil {
		// The user sees that the region is being difficult; the detail goes to the log.
		r.Logger.WarnContext(ctx, "reconcile failed", "instance", inst.ID, "org", org, "attempt", t.Attempt, "duration", took, "err", err)
		if _, werr := r.writeStatus(ctx, inst, inst.Failed("The region did not complete a request for this instance; retrying.", false, r.Now()), instance.EventStatusChanged); werr != nil {
			return 0, errors.Join(err, werr)
		}
		return again, err
	}
	// A lease wakes its instance when it ends, however settled the instance is by then.
	if inst.ExpiresAt != nil && !inst.Deleting() {
		if until := inst.ExpiresAt.Sub(r.Now()); until > 0 && (again == 0 || until < again) {
			again = until
		}
	}
	r.Logger.InfoContext(ctx, "reconcile", "instance", inst.ID, "org", org, "attempt", t.Attempt, "duration", took,
		"provisioning", inst.Status.ProvisioningStatus, "power", inst.Status.PowerState, "again", again)
	return again, nil
}

// writeStatus writes the status, with an event of the kind naming what changed, when it
// differs from the stored one: the history records only changes a user can see. A stale write
// (a newer status exists) is not an error: the instance will be reconciled again from the
// newer state.
func (r *Reconciler) writeStatus(ctx context.Context, inst *instance.Instance, st instance.Status, kind instance.EventKind) (bool, error) {
	changed := instance.StatusChanges(inst.Status, st)
	if len(changed) == 0 {
		return false, nil
	}
	// The final write of a reconcile must land even if the worker is shutting down.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	ok, err := r.Store.WriteStatus(ctx, inst, st, instance.Event{Kind: kind, Changed: changed, At: r.Now()})
	if err != nil {
		return false, fmt.Errorf("write status: %w", err)
	}
	if ok {
		inst.Status = st
		inst.StatusVersion++
	}
	return ok, nil
}

func (r *Reconciler) reconcile(ctx context.Context, inst *instance.Instance) (time.Duration, error) {
	// An instance whose network is gone is marked for deletion before its servers are looked
	// for: marking it needs none of them.
	if !inst.Deleting() && !r.NetworkExists(inst.NetworkID) {
		return r.networkDeleted(ctx, inst)
	}
	servers, err := r.Region.FindServers(ctx, inst.Scope(), region.InstanceTag, inst.ID)
	if err != nil {
		return 0, fmt.Errorf("find servers: %w", err)
	}
	if inst.Deleting() {
		return r.deprovision(ctx, inst, servers)
	}
	now := r.Now()
	if inst.ExpiresAt != nil && !now.Before(*inst.ExpiresAt) {
		return r.expire(ctx, inst)
	}
	servers, err = r.unique(ctx, inst, servers)
	if err != nil {
		return 0, err
	}
	if len(servers) == 0 {
		switch _, err := r.Region.CreateServer(ctx, inst.ServerSpec()); {
		case errors.Is(err, region.ErrNoCapacity):
			// Like Nova's "no valid host": the instance waits, saying why, and is tried again
			// as capacity may have freed.
			msg := "The region has no room for the server now: " + region.Reason(err, region.ErrNoCapacity) + ". Retrying."
			_, werr := r.writeStatus(ctx, inst, inst.Awaiting(instance.ReasonNoCapacity, msg, now), instance.EventStatusChanged)
			return r.CapacityRetry, werr
		case errors.Is(err, region.ErrRefused):
			_, werr := r.writeStatus(ctx, inst, inst.Failed("The region refused to create the server: "+region.Reason(err, region.ErrRefused)+".", true, now), instance.EventStatusChanged)
			return 0, werr
		case err != nil:
			return 0, fmt.Errorf("create server: %w", err)
		}
		reason, msg := instance.ReasonProvisioning, "The server is being created."
		if inst.Status.ObservedGeneration > 0 {
			msg = "The server was gone and is being recreated."
		}
		if inst.RebuildGeneration > inst.Status.ObservedGeneration {
			reason, msg = instance.ReasonRebuilding, "The server is being rebuilt: its disk, IP addresses and MAC address are new."
		}
		_, err := r.writeStatus(ctx, inst, inst.Awaiting(reason, msg, now), instance.EventStatusChanged)
		return r.Yield, err
	}
	srv := &servers[0]
	if srv.State == region.ServerDeleting {
		return r.Yield, nil // a rebuild or a duplicate on its way out; the next server follows
	}
	if fields := inst.RebuildNeeded(srv); len(fields) > 0 {
		return r.rebuild(ctx, inst, srv, fields)
	}
	if inst.NetworkingDiffers(srv) {
		updated, err := r.Region.UpdateNetworking(ctx, srv.ID, region.ServerNetworking(inst.Networking))
		if err != nil {
			return 0, fmt.Errorf("update networking: %w", err)
		}
		srv = &updated
	}
	if inst.ResizeNeeded(srv) {
		resized, again, err := r.resize(ctx, inst, srv)
		if resized == nil {
			return again, err
		}
		srv = resized
	}
	if inst.StartAfterResize(srv) {
		// Before the status is written, as a stop after a build: a failed start is retried
		// while the status still shows the resize.
		started, err := r.Region.StartServer(ctx, srv.ID)
		if err != nil {
			return 0, fmt.Errorf("start server after its resize: %w", err)
		}
		srv = &started
	}
	if inst.StopWhenBuilt(srv) {
		// Before the status is written: a failed stop is retried while the status still
		// shows the build that just completed.
		stopped, err := r.Region.StopServer(ctx, srv.ID)
		switch {
		case err == nil:
			srv = &stopped
		case !errors.Is(err, region.ErrRefused): // refused: someone stopped it already
			return 0, fmt.Errorf("stop server built for a stopped instance: %w", err)
		}
	}
	if _, err := r.writeStatus(ctx, inst, inst.Observe(srv, now), instance.EventStatusChanged); err != nil {
		return 0, err
	}
	if srv.State.Provisioning() {
		return r.Yield, nil
	}
	return 0, nil
}

// expire carries out the end of the instance's lease, recording it as an ACTION EXPIRE by
// "system" before the change it causes. DELETE marks the instance for deletion (and the lease
// stays, a deleting instance has no other future); STOP, and DELETE of an instance with
// deletion protection (the ACTION says so, with outcome UNPROCESSABLE), ends the lease and
// asks for the instance stopped, which the next pass does.
func (r *Reconciler) expire(ctx context.Context, inst *instance.Instance) (time.Duration, error) {
	now := r.Now().UTC()
	ev := instance.ActionEvent{Actor: "system", Action: instance.ActionExpire, At: now}
	if inst.ExpiryAction == instance.ExpireDelete && !inst.DeletionProtection {
		ev.Message = "The lease ended: the instance is deleted."
		if _, err := r.Store.Act(ctx, inst, nil, ev); err != nil {
			return 0, fmt.Errorf("record the end of the lease: %w", err)
		}
		next, st, changed := inst.MarkDeleting(now, "system", "The instance's lease ended, and the instance is being deleted.")
		if _, err := r.Store.UpdateSpec(ctx, &next, nil, nil, &st, changed, instance.Idempotency{}); err != nil {
			return 0, fmt.Errorf("delete the instance whose lease ended: %w", err)
		}
		return r.Yield, nil // changed meanwhile or not, the next pass looks again
	}
	next := *inst
	next.ExpiresAt, next.ExpiryAction, next.Power = nil, "", instance.IntentStopped
	next.UpdatedAt, next.UpdatedBy = now, "system"
	ev.Message = "The lease ended: the instance is stopped."
	if inst.ExpiryAction == instance.ExpireDelete {
		ev.Outcome = instance.CodeUnprocessable
		ev.Message = "The lease ended, but the instance has deletion protection: it is stopped instead of deleted."
	}
	changed := instance.SpecChanges(inst.Spec, next.Spec)
	if inst.DesiredPower() != instance.IntentStopped {
		changed = append(changed, "desiredPowerState")
	}
	if _, err := r.Store.Act(ctx, &next, changed, ev); err != nil {
		return 0, fmt.Errorf("stop the instance whose lease ended: %w", err)
	}
	return r.Yield, nil
}

// resize gives the server the instance's flavor in place, stopping it first when the user
// consented to a restart (or wants it stopped anyway). It returns the resized server for the
// reconcile to go on with (to start it again), or nil with when to look again.
func (r *Reconciler) resize(ctx context.Context, inst *instance.Instance, srv *region.Server) (*region.Server, time.Duration, error) {
	now := r.Now()
	switch {
	case srv.State == region.ServerStopped:
		resized, err := r.Region.ResizeServer(ctx, srv.ID, inst.FlavorID)
		switch {
		case errors.Is(err, region.ErrNoCapacity):
			msg := "The region has no room to resize the server to flavor " + inst.FlavorID + " now: " + region.Reason(err, region.ErrNoCapacity) + ". Retrying."
			_, werr := r.writeStatus(ctx, inst, inst.ResizeHeld(srv, instance.ReasonNoCapacity, msg, now), instance.EventStatusChanged)
			return nil, r.CapacityRetry, werr
		case errors.Is(err, region.ErrRefused):
			msg := "The region refused to resize the server to flavor " + inst.FlavorID + ": " + region.Reason(err, region.ErrRefused) + "."
			_, werr := r.writeStatus(ctx, inst, inst.Failed(msg, true, now), instance.EventStatusChanged)
			return nil, 0, werr
		case err != nil:
			return nil, 0, fmt.Errorf("resize server: %w", err)
		}
		r.Metrics.resizes.Inc()
		return &resized, 0, nil
	case srv.State == region.ServerRunning && (inst.ResizeRestart || inst.DesiredPower() == instance.IntentStopped):
		stopped, err := r.Region.StopServer(ctx, srv.ID)
		switch {
		case err == nil:
			srv = &stopped
		case !errors.Is(err, region.ErrRefused): // refused: it is stopping already
			return nil, 0, fmt.Errorf("stop server to resize it: %w", err)
		}
		_, err = r.writeStatus(ctx, inst, inst.Observe(srv, now), instance.EventStatusChanged)
		return nil, r.Yield, err
	case srv.State == region.ServerRunning:
		// Started again (by its guest or the region) after a resize asked while it was
		// stopped, without consent to restart it: the resize waits for it to stop.
		msg := "The server is running, and the resize to flavor " + inst.FlavorID + " was asked without allowRestart: it is resized once the instance is stopped."
		_, err := r.writeStatus(ctx, inst, inst.ResizeHeld(srv, instance.ReasonResizing, msg, now), instance.EventStatusChanged)
		return nil, r.CapacityRetry, err
	}
	// On its way between states (stopping, starting, rebooting, still building).
	_, err := r.writeStatus(ctx, inst, inst.Observe(srv, now), instance.EventStatusChanged)
	return nil, r.Yield, err
}

// unique enforces one server per instance: the oldest is kept and the others deleted.
func (r *Reconciler) unique(ctx context.Context, inst *instance.Instance, servers []region.Server) ([]region.Server, error) {
	live := region.Live(servers)
	if len(live) <= 1 {
		if len(live) == 0 && len(servers) > 0 {
			return servers[:1], nil
		}
		return live, nil
	}
	slices.SortFunc(live, func(a, b region.Server) int { return a.CreatedAt.Compare(b.CreatedAt) })
	for _, extra := range live[1:] {
		if err := r.Region.DeleteServer(ctx, extra.ID); err != nil {
			return nil, fmt.Errorf("delete duplicate server: %w", err)
		}
		r.Metrics.duplicates.Inc()
		r.Logger.WarnContext(ctx, "duplicate server deleted", "instance", inst.ID, "kept", live[0].ID, "deleted", extra.ID)
		if _, err := r.Store.Warn(ctx, inst, r.Now(), "The region had made more than one server for this instance; the extra one was deleted."); err != nil {
			return nil, err
		}
	}
	return live[:1], nil
}

// rebuild replaces a server whose shape the user changed in a way only a new server can
// realise. The API accepts such a change only with the user's consent, recorded as the
// instance's RebuildGeneration; without it (a server changed behind our back), the instance
// shows the error instead of losing its disk.
func (r *Reconciler) rebuild(ctx context.Context, inst *instance.Instance, srv *region.Server, fields []string) (time.Duration, error) {
	now := r.Now()
	if inst.RebuildGeneration == 0 {
		msg := "The server differs from the instance in " + strings.Join(fields, ", ") + ", which needs a rebuild nobody allowed."
		_, err := r.writeStatus(ctx, inst, inst.Failed(msg, true, now), instance.EventStatusChanged)
		return 0, err
	}
	if err := r.Region.DeleteServer(ctx, srv.ID); err != nil {
		return 0, fmt.Errorf("delete server to rebuild: %w", err)
	}
	r.Metrics.rebuilds.Inc()
	_, err := r.writeStatus(ctx, inst, inst.Awaiting(instance.ReasonRebuilding,
		"The server is being rebuilt for a new "+strings.Join(fields, ", ")+": its disk, IP addresses and MAC address are lost.", now),
		instance.EventRebuildStarted)
	return r.Yield, err
}

// networkDeleted requests the deletion of an instance whose network the region deleted; the
// next reconcile deprovisions it like any other.
func (r *Reconciler) networkDeleted(ctx context.Context, inst *instance.Instance) (time.Duration, error) {
	next, st, changed := inst.MarkDeleting(r.Now().UTC(), "region", "The instance's network was deleted, and the instance is deleted with it.")
	refusal, err := r.Store.UpdateSpec(ctx, &next, nil, nil, &st, changed, instance.Idempotency{})
	if err != nil {
		return 0, fmt.Errorf("delete instance of a deleted network: %w", err)
	}
	if refusal != nil {
		r.Logger.InfoContext(ctx, "instance changed while its network was deleted; looking again", "instance", inst.ID)
	}
	return r.Yield, nil
}

// deprovision is strictly ordered: delete the servers, wait until the region confirms they are
// gone, and only then release the quota and forget the instance (freeing its name).
func (r *Reconciler) deprovision(ctx context.Context, inst *instance.Instance, servers []region.Server) (time.Duration, error) {
	for _, s := range servers {
		if s.State == region.ServerDeleting {
			continue
		}
		if err := r.Region.DeleteServer(ctx, s.ID); err != nil {
			return 0, fmt.Errorf("delete server: %w", err)
		}
	}
	if len(servers) > 0 {
		return r.Yield, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := r.Store.Forget(ctx, inst, r.Now()); err != nil {
		return 0, fmt.Errorf("forget instance: %w", err)
	}
	return 0, nil
}

// MarkFailed is the queue's dead-letter hook: an instance that could not be reconciled after
// every retry shows ERROR.
func (r *Reconciler) MarkFailed(ctx context.Context, key, _ string) {
	org, id, err := SplitKey(key)
	if err != nil {
		return
	}
	inst, err := r.Store.Get(ctx, []string{org}, id)
	if err != nil {
		return
	}
	if _, err := r.writeStatus(ctx, inst, inst.Failed("The instance could not be reconciled after repeated attempts; an operator has been alerted.", true, r.Now()), instance.EventStatusChanged); err != nil {
		r.Logger.ErrorContext(ctx, "mark instance failed", "instance", id, "err", err)
	}
}
