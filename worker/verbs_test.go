package worker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
)

// The operational verbs against a region the worker realises instances in:
// each acts on the instance's one server, and the power the user asked for outlives it.

// operator may act on acme/web's instances but not change them.
var operator = auth.WithPrincipal(context.Background(), auth.Principal{
	Subject: "otto", Grants: []auth.Grant{{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleOperator}},
})

// verbCall is one operational verb as these tests call it.
type verbCall struct {
	name   string
	action instance.Action
	call   func(svc *instance.Service, id string) error
}

var allVerbs = []verbCall{
	{"start", instance.ActionStart, func(svc *instance.Service, id string) error { _, err := svc.Start(operator, id, nil); return err }},
	{"stop", instance.ActionStop, func(svc *instance.Service, id string) error { _, err := svc.Stop(operator, id, nil); return err }},
	{"reboot", instance.ActionReboot, func(svc *instance.Service, id string) error {
		_, err := svc.Reboot(operator, id, false, nil)
		return err
	}},
	{"hard reboot", instance.ActionHardReboot, func(svc *instance.Service, id string) error {
		_, err := svc.Reboot(operator, id, true, nil)
		return err
	}},
	{"console", instance.ActionConsole, func(svc *instance.Service, id string) error { _, err := svc.Console(operator, id, nil); return err }},
	{"ssh key", instance.ActionSSHKey, func(svc *instance.Service, id string) error { _, err := svc.SSHKey(operator, id); return err }},
	{"snapshot", instance.ActionSnapshot, func(svc *instance.Service, id string) error {
		_, err := svc.Snapshot(operator, instance.SnapshotRequest{ID: id, Name: "snap"})
		return err
	}},
}

// codeOf returns the code of a verb's error, failing the test for field problems.
func codeOf(t *testing.T, err error) instance.Code {
	t.Helper()
	var inv *instance.Invalid
	if errors.As(err, &inv) {
		t.Fatalf("got field problems %v, want a whole-operation error", err)
	}
	if err == nil {
		return ""
	}
	return instance.CodeOf(err)
}

// actions returns the ACTION events of the instance's history.
func (e *env) actions(t *testing.T, id string) []instance.Record {
	t.Helper()
	all, _, err := e.st.History(bg, "acme", id, "", 10_000)
	if err != nil {
		t.Fatal(err)
	}
	var out []instance.Record
	for _, r := range all {
		if r.Kind == instance.EventAction {
			out = append(out, r)
		}
	}
	return out
}

// lastAction returns the newest ACTION event of the instance, which must exist.
func (e *env) lastAction(t *testing.T, id string) instance.Record {
	t.Helper()
	acts := e.actions(t, id)
	if len(acts) == 0 {
		t.Fatalf("instance %s has no ACTION events", id)
	}
	return acts[len(acts)-1]
}

// waitStopped waits until the instance shows a STOPPED server with its generation observed,
// and returns it.
func (e *env) waitStopped(t *testing.T, id string) *instance.Instance {
	t.Helper()
	var inst *instance.Instance
	eventually.Holds(t, convergeLimit, func() bool {
		inst = e.lookup(t, id)
		return inst != nil && inst.Status.ProvisioningStatus == instance.ProvisioningProvisioned &&
			inst.Status.PowerState == instance.PowerStopped && inst.Status.ObservedGeneration == inst.Generation
	}, "instance %s STOPPED, last %s", id, last(&inst))
	return inst
}

// stop stops the instance through the API service; it must be accepted.
func (e *env) stop(t *testing.T, id string) *instance.Instance {
	t.Helper()
	inst, err := e.svc.Stop(operator, id, nil)
	if err != nil {
		t.Fatalf("stop %s: %v", id, err)
	}
	if inst.DesiredPower() != instance.IntentStopped {
		t.Fatalf("stop returned desired power %s", inst.DesiredPower())
	}
	return inst
}

// A verb acts on exactly one backing server. An instance that had a server and
// has none (deleted behind its back, whether still DELETING or gone) is a CONSISTENCY error for
// every verb; nothing of the instance changes, and each refusal is on its history.
func TestVerbsWithoutAServerAreConsistencyErrors(t *testing.T) {
	e := newEnv(t)
	inst := e.waitRunning(t, e.create(t, "web-1").ID)
	srv := e.server(t, inst)
	// Nothing may recreate the server while the verbs look for it.
	if err := e.work.stop(convergeLimit); err != nil {
		t.Fatal(err)
	}
	// The clock stops too, so that the server stays DELETING until the test moves on.
	if err := e.clock.stop(convergeLimit); err != nil {
		t.Fatal(err)
	}
	if err := e.probe.DeleteServer(bg, srv.ID); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T) {
		for _, v := range allVerbs {
			err := v.call(e.svc, inst.ID)
			if got := codeOf(t, err); got != instance.CodeConsistency {
				t.Errorf("%s: %v, want CONSISTENCY", v.name, err)
				continue
			}
			if !strings.Contains(err.Error(), "no server") {
				t.Errorf("%s: %q does not say the instance has no server", v.name, err)
			}
			if a := e.lastAction(t, inst.ID); a.Action != v.action || a.Outcome != instance.CodeConsistency || a.Actor != "otto" {
				t.Errorf("%s recorded as %+v, want %s by otto with outcome CONSISTENCY", v.name, a, v.action)
			}
		}
		if got := e.get(t, inst.ID); got.Generation != inst.Generation || got.DesiredPower() != instance.IntentRunning {
			t.Errorf("refused verbs changed the instance: generation %d, desired power %s", got.Generation, got.DesiredPower())
		}
	}
	t.Run("server deleting", func(t *testing.T) {
		if srvs := e.servers(t, inst); len(srvs) != 1 || srvs[0].State != region.ServerDeleting {
			t.Fatalf("servers %+v, want the one DELETING", srvs)
		}
		check(t)
	})
	t.Run("server gone", func(t *testing.T) {
		e.clock = goRun(t, "region clock", e.region.Run)
		eventually.Holds(t, convergeLimit, func() bool { return len(e.servers(t, inst)) == 0 }, "the server gone")
		check(t)
	})
	if imgs, err := e.probe.Images(bg, "acme", "web"); err != nil || len(imgs) != 0 {
		t.Errorf("images %+v (%v), want none made", imgs, err)
	}
}

// Two live servers carrying the instance's tag are a CONSISTENCY error naming
// both, for every verb, and none of them is touched; a server on its way out does not count.
func TestVerbsWithTwoServersAreConsistencyErrors(t *testing.T) {
	e := newEnv(t)
	inst := e.waitRunning(t, e.create(t, "web-1").ID)
	kept := e.server(t, inst)
	// The worker would delete the extra server at once.
	if err := e.work.stop(convergeLimit); err != nil {
		t.Fatal(err)
	}
	extra, err := e.probe.CreateServer(bg, inst.ServerSpec())
	if err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, convergeLimit, func() bool {
		srv, err := e.probe.GetServer(bg, extra.ID)
		return err == nil && srv.State == region.ServerRunning
	}, "the extra server RUNNING")
	for _, v := range allVerbs {
		err := v.call(e.svc, inst.ID)
		if got := codeOf(t, err); got != instance.CodeConsistency {
			t.Errorf("%s: %v, want CONSISTENCY", v.name, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, kept.ID) || !strings.Contains(msg, extra.ID) {
			t.Errorf("%s: %q does not name both servers %s and %s", v.name, msg, kept.ID, extra.ID)
		}
		if a := e.lastAction(t, inst.ID); a.Action != v.action || a.Outcome != instance.CodeConsistency ||
			!strings.Contains(a.Message, kept.ID) || !strings.Contains(a.Message, extra.ID) {
			t.Errorf("%s recorded as %+v, want outcome CONSISTENCY naming both servers", v.name, a)
		}
	}
	for _, srv := range e.servers(t, inst) {
		if srv.State != region.ServerRunning {
			t.Errorf("server %s is %s after refused verbs, want RUNNING", srv.ID, srv.State)
		}
	}

	// With the extra one on its way out (the clock stopped keeps it DELETING), the verbs act on
	// the one left.
	if err := e.clock.stop(convergeLimit); err != nil {
		t.Fatal(err)
	}
	if err := e.probe.DeleteServer(bg, extra.ID); err != nil {
		t.Fatal(err)
	}
	session, err := e.svc.Console(operator, inst.ID, nil)
	if err != nil {
		t.Fatalf("console with one server left: %v", err)
	}
	grant, err := e.svc.RedeemConsole(bg, session.Token)
	if err != nil {
		t.Fatalf("redeem the console session: %v", err)
	}
	attached, err := e.svc.AttachConsole(bg, grant)
	if err != nil {
		t.Fatalf("attach the console with one server left: %v", err)
	}
	attached.Console.Close()
}

// Stopping an instance whose server is not built yet records the intent (asking
// again is refused: nothing would change), the other verbs are refused until the build
// completes, and once built the worker stops the server. Starting again before the build
// completes cancels the intent.
func TestStopBeforeTheServerIsBuilt(t *testing.T) {
	tests := []struct {
		name string
		// worker runs the worker before the stop, so the server exists but is still PENDING.
		worker bool
		// restart starts the instance again before the build completes.
		restart bool
	}{
		{name: "before the server exists"},
		{name: "while the server is being built", worker: true},
		{name: "stopped then started while being built", worker: true, restart: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The region's clock starts only after the verbs: the server cannot finish its
			// build under them.
			e := newEnv(t, func(s *setup) { s.manual = true })
			created := e.create(t, "web-1")
			var pending region.Server
			if tt.worker {
				e.work = goRun(t, "worker", e.wk.Start)
				var inst *instance.Instance
				eventually.Holds(t, convergeLimit, func() bool {
					inst = e.get(t, created.ID)
					return len(e.servers(t, created)) == 1 && inst.Status.ProvisioningStatus == instance.ProvisioningProvisioning
				}, "a server PENDING, last %s", last(&inst))
				pending = e.server(t, created)
			}

			stopped := e.stop(t, created.ID)
			if stopped.Generation != created.Generation+1 {
				t.Errorf("generation %d after the stop, want %d", stopped.Generation, created.Generation+1)
			}
			if got := e.get(t, created.ID); got.DesiredPower() != instance.IntentStopped || got.Generation != stopped.Generation {
				t.Errorf("stored desired power %s at generation %d, want STOPPED at %d", got.DesiredPower(), got.Generation, stopped.Generation)
			}
			if a := e.lastAction(t, created.ID); a.Action != instance.ActionStop || a.Outcome != "" || a.Actor != "otto" ||
				!strings.Contains(a.Message, "when the build completes") || len(a.Changed) != 1 || a.Changed[0] != "desiredPowerState" {
				t.Errorf("stop recorded as %+v, want a successful STOP saying it takes effect when built", a)
			}
			// A second stop asks for what is already asked: it succeeds and records nothing.
			before := e.lastAction(t, created.ID)
			again, err := e.svc.Stop(operator, created.ID, nil)
			if err != nil || again.Generation != stopped.Generation || again.DesiredPower() != instance.IntentStopped {
				t.Errorf("second stop while building: %+v, %v; want the instance unchanged", again, err)
			}
			if a := e.lastAction(t, created.ID); a.Cursor != before.Cursor {
				t.Errorf("the second stop was recorded as %+v: a no-op leaves no history", a)
			}
			for _, v := range allVerbs {
				if v.action == instance.ActionStart || v.action == instance.ActionStop {
					continue
				}
				err := v.call(e.svc, created.ID)
				if got := codeOf(t, err); got != instance.CodeUnprocessable {
					t.Errorf("%s while building: %v, want UNPROCESSABLE", v.name, err)
				}
				if a := e.lastAction(t, created.ID); a.Action != v.action || a.Outcome != instance.CodeUnprocessable {
					t.Errorf("%s while building recorded as %+v, want outcome UNPROCESSABLE", v.name, a)
				}
			}
			if got := e.get(t, created.ID); got.Generation != stopped.Generation || got.DesiredPower() != instance.IntentStopped {
				t.Errorf("refused verbs changed the instance: generation %d, desired %s", got.Generation, got.DesiredPower())
			}
			want := instance.PowerStopped
			if tt.restart {
				started, err := e.svc.Start(operator, created.ID, nil)
				if err != nil {
					t.Fatalf("start while building: %v", err)
				}
				if started.DesiredPower() != instance.IntentRunning || started.Generation != stopped.Generation+1 {
					t.Errorf("start while building: desired %s at generation %d", started.DesiredPower(), started.Generation)
				}
				want = instance.PowerRunning
			}

			// The build completes: the worker applies the intent to the server it built.
			if !tt.worker {
				e.work = goRun(t, "worker", e.wk.Start)
			}
			e.clock = goRun(t, "region clock", e.region.Run)
			var inst *instance.Instance
			if want == instance.PowerStopped {
				inst = e.waitStopped(t, created.ID)
			} else {
				inst = e.waitRunning(t, created.ID)
			}
			srv := e.server(t, inst)
			if want == instance.PowerStopped && srv.State != region.ServerStopped {
				t.Errorf("server %s is %s, want STOPPED", srv.ID, srv.State)
			}
			if tt.worker && srv.ID != pending.ID {
				t.Errorf("instance on server %s, want the one that was building, %s", srv.ID, pending.ID)
			}
		})
	}
}

// The desired power belongs to the instance, not to its server. A stopped
// instance whose server is replaced, by an allowed rebuild or because the server vanished,
// ends with the new server stopped too.
func TestPowerIntentSurvivesANewServer(t *testing.T) {
	tests := []struct {
		name    string
		replace func(e *env, t *testing.T, inst *instance.Instance, srv region.Server)
	}{
		{"rebuild", func(e *env, t *testing.T, inst *instance.Instance, _ region.Server) {
			e.update(t, instance.UpdateRequest{ID: inst.ID, FlavorID: ptr("g1.medium"), AllowRebuild: true})
		}},
		{"server deleted behind its back", func(e *env, t *testing.T, _ *instance.Instance, srv region.Server) {
			if err := e.probe.DeleteServer(bg, srv.ID); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			created := e.create(t, "web-1")
			e.waitRunning(t, created.ID)
			e.stop(t, created.ID)
			before := e.waitStopped(t, created.ID)
			old := e.server(t, before)

			tt.replace(e, t, before, old)
			var inst *instance.Instance
			var srvs []region.Server
			eventually.Holds(t, convergeLimit, func() bool {
				inst = e.get(t, created.ID)
				srvs = e.servers(t, inst)
				return len(srvs) == 1 && srvs[0].ID != old.ID && srvs[0].State == region.ServerStopped &&
					inst.Status.ProvisioningStatus == instance.ProvisioningProvisioned &&
					inst.Status.PowerState == instance.PowerStopped && inst.Status.ObservedGeneration == inst.Generation
			}, "a new server, STOPPED; last %s, servers %s", last(&inst), eventually.Lazy(func() string { return fmt.Sprintf("%+v", srvs) }))
			if inst.DesiredPower() != instance.IntentStopped {
				t.Errorf("desired power %s after the new server, want STOPPED", inst.DesiredPower())
			}
			if inst.Status.MACAddress != srvs[0].MAC {
				t.Errorf("instance MAC %s, want the new server's %s", inst.Status.MACAddress, srvs[0].MAC)
			}
		})
	}
}

// An instance started again stays running: the worker stops only servers of
// instances whose user wants them stopped, however often it reconciles.
func TestStartedInstanceIsNotStoppedAgain(t *testing.T) {
	e := newEnv(t)
	created := e.create(t, "web-1")
	e.waitRunning(t, created.ID)
	e.stop(t, created.ID)
	stopped := e.waitStopped(t, created.ID)
	srv := e.server(t, stopped)

	started, err := e.svc.Start(operator, created.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if started.DesiredPower() != instance.IntentRunning || started.Generation != stopped.Generation+1 {
		t.Errorf("start: desired %s at generation %d, want RUNNING at %d", started.DesiredPower(), started.Generation, stopped.Generation+1)
	}
	inst := e.waitRunning(t, created.ID)
	for range 3 {
		if err := e.q.Enqueue(bg, inst.Key()); err != nil {
			t.Fatal(err)
		}
		eventually.Holds(t, convergeLimit, func() bool {
			waiting, err := e.q.Waiting(bg, inst.Key())
			return err == nil && !waiting
		}, "the reconcile done")
	}
	inst = e.get(t, created.ID)
	if now := e.server(t, inst); now.ID != srv.ID || now.State != region.ServerRunning || !converged(inst) {
		t.Errorf("after reconciles: server %s %s, instance %s; want the same server RUNNING", now.ID, now.State, statusOf(inst))
	}
	// The history shows the stop and the start, each once, and nothing stopping after the start.
	acts := e.actions(t, created.ID)
	if len(acts) != 2 || acts[0].Action != instance.ActionStop || acts[1].Action != instance.ActionStart {
		t.Fatalf("actions %+v, want STOP then START", acts)
	}
	all, _, err := e.st.History(bg, "acme", created.ID, acts[1].Cursor, 10_000)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if p := r.Instance.Status.PowerState; p == instance.PowerStopping || p == instance.PowerStopped {
			t.Errorf("after the start the history shows %s %s", r.Kind, p)
		}
	}

	// Starting a running instance asks for what is: it succeeds and changes and records nothing.
	again, err := e.svc.Start(operator, created.ID, nil)
	if err != nil || again.Generation != inst.Generation || again.DesiredPower() != instance.IntentRunning {
		t.Errorf("start of a running instance: %+v, %v; want the instance unchanged", again, err)
	}
	if acts := e.actions(t, created.ID); len(acts) != 2 {
		t.Errorf("actions %+v after a start of a running instance, want it unrecorded", acts)
	}
}

// A region that does not answer makes every verb UNAVAILABLE, recorded as
// such, with nothing of the instance or its server changed.
func TestVerbsWhenTheRegionFails(t *testing.T) {
	e := newEnv(t)
	inst := e.waitRunning(t, e.create(t, "web-1").ID)
	srv := e.server(t, inst)
	// Another API process whose every region call fails; the worker's region is fine.
	broken, err := sim.New(e.rdb, sim.Options{Catalog: e.cat, Faults: sim.Faults{ErrorRate: 1}})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := instance.NewService(instance.Options{Catalog: e.cat, Store: e.st, Queue: e.q, Region: broken, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range allVerbs {
		err := v.call(svc, inst.ID)
		if got := codeOf(t, err); got != instance.CodeUnavailable {
			t.Errorf("%s: %v, want UNAVAILABLE", v.name, err)
		}
		if a := e.lastAction(t, inst.ID); a.Action != v.action || a.Outcome != instance.CodeUnavailable {
			t.Errorf("%s recorded as %+v, want outcome UNAVAILABLE", v.name, a)
		}
	}
	got := e.get(t, inst.ID)
	if got.Generation != inst.Generation || got.DesiredPower() != instance.IntentRunning || !converged(got) {
		t.Errorf("instance %s with desired %s, want it unchanged", statusOf(got), got.DesiredPower())
	}
	if now := e.server(t, got); now.ID != srv.ID || now.State != region.ServerRunning {
		t.Errorf("server %s is %s, want %s RUNNING", now.ID, now.State, srv.ID)
	}
}

// vanishing is the region of an API process whose server disappears right after it was
// found: every FindServers returns the servers, which are gone from the region by the time
// the caller acts on them.
type vanishing struct {
	region.Client
	t     *testing.T
	probe *sim.Sim
}

func (v *vanishing) FindServers(ctx context.Context, scope region.Scope, tag, value string) ([]region.Server, error) {
	srvs, err := v.Client.FindServers(ctx, scope, tag, value)
	for _, srv := range srvs {
		if err := v.probe.DeleteServer(ctx, srv.ID); err != nil {
			return nil, err
		}
		eventually.Holds(v.t, convergeLimit, func() bool {
			_, err := v.probe.GetServer(ctx, srv.ID)
			return errors.Is(err, region.ErrServerNotFound)
		}, "server %s gone", srv.ID)
	}
	return srvs, err
}

// A server that vanished between finding it and acting on it is NOT_FOUND,
// the region's meaning, not an internal error; the worker then recreates it.
func TestVerbOnAServerThatVanished(t *testing.T) {
	e := newEnv(t)
	created := e.create(t, "web-1")
	svc, err := instance.NewService(instance.Options{Catalog: e.cat, Store: e.st, Queue: e.q,
		Region: &vanishing{Client: e.probe, t: t, probe: e.probe}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range allVerbs {
		if v.action == instance.ActionStart || v.action == instance.ActionConsole {
			// On a running instance, start is a no-op, and a console session is a grant the
			// server is asked about only when it is used: neither needs the server now.
			continue
		}
		inst := e.waitRunning(t, created.ID)
		eventually.Holds(t, convergeLimit, func() bool { return len(e.servers(t, inst)) == 1 }, "one server")
		old := e.server(t, inst)
		err := v.call(svc, inst.ID)
		if got := codeOf(t, err); got != instance.CodeNotFound {
			t.Errorf("%s: %v, want NOT_FOUND", v.name, err)
		}
		if a := e.lastAction(t, inst.ID); a.Action != v.action || a.Outcome != instance.CodeNotFound || !strings.Contains(a.Message, "gone") {
			t.Errorf("%s recorded as %+v, want outcome NOT_FOUND saying the server is gone", v.name, a)
		}
		// The worker replaces the server before the next verb. Wait for the new one to be
		// built, not only created: until the worker records the new build, the instance's
		// status still reads RUNNING from the old server, and a verb on a server being built
		// is refused as such.
		eventually.Holds(t, convergeLimit, func() bool {
			srvs := e.servers(t, inst)
			return len(srvs) == 1 && srvs[0].ID != old.ID && srvs[0].State == region.ServerRunning
		}, "a new server for %s, built", inst.ID)
	}
}

// actHook is the instance store of an API process with something slipped in just before its
// first Act, as a concurrent worker would.
type actHook struct {
	instance.Store
	before func()
}

func (s *actHook) Act(ctx context.Context, inst *instance.Instance, changed []string, ev instance.ActionEvent) (*instance.Refusal, error) {
	if f := s.before; f != nil {
		s.before = nil
		f()
	}
	return s.Store.Act(ctx, inst, changed, ev)
}

// A stop asked for while the build completes still stops the server. The API
// finds the server building and records only the intent, but before the intent lands the
// build completes and the worker records the instance as running; the worker then sees an
// intent it has not realised, and stops the server.
func TestStopAskedWhileTheBuildCompletes(t *testing.T) {
	e := newEnv(t, func(s *setup) { s.manual = true })
	e.work = goRun(t, "worker", e.wk.Start)
	created := e.create(t, "web-1")
	var inst *instance.Instance
	eventually.Holds(t, convergeLimit, func() bool {
		inst = e.get(t, created.ID)
		return len(e.servers(t, created)) == 1 && inst.Status.ProvisioningStatus == instance.ProvisioningProvisioning
	}, "a server PENDING, last %s", last(&inst))

	hook := &actHook{Store: e.st, before: func() {
		// The build completes and the worker shows the instance running, all between the
		// API's look at the server and its write of the intent.
		e.clock = goRun(t, "region clock", e.region.Run)
		e.waitRunning(t, created.ID)
	}}
	svc, err := instance.NewService(instance.Options{Catalog: e.cat, Store: hook, Queue: e.q, Region: e.region, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	stopped, err := svc.Stop(operator, created.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a := e.lastAction(t, created.ID); !strings.Contains(a.Message, "when the build completes") {
		t.Fatalf("stop recorded as %+v, want the intent recorded for a server being built", a)
	}
	inst = e.waitStopped(t, created.ID)
	if inst.Generation != stopped.Generation || inst.DesiredPower() != instance.IntentStopped {
		t.Errorf("instance at generation %d wanting %s, want %d wanting STOPPED", inst.Generation, inst.DesiredPower(), stopped.Generation)
	}
	if srv := e.server(t, inst); srv.State != region.ServerStopped {
		t.Errorf("server %s is %s, want STOPPED", srv.ID, srv.State)
	}
}

// askedRegion notes that the region was asked to change a server's power.
type askedRegion struct {
	region.Client
	asked *atomic.Bool
}

func (r askedRegion) StartServer(ctx context.Context, id string) (region.Server, error) {
	r.asked.Store(true)
	return r.Client.StartServer(ctx, id)
}

func (r askedRegion) StopServer(ctx context.Context, id string) (region.Server, error) {
	r.asked.Store(true)
	return r.Client.StopServer(ctx, id)
}

func (r askedRegion) RebootServer(ctx context.Context, id string, hard bool) (region.Server, error) {
	r.asked.Store(true)
	return r.Client.RebootServer(ctx, id, hard)
}

// heldActs is the store with a verb's ACTION write held, once the region has been asked,
// until the worker has recorded the status change the region reports: a slow API write meets
// a fast worker. A verb that records its ACTION before asking the region is never held.
type heldActs struct {
	instance.Store
	asked *atomic.Bool
	wait  func()
}

func (h heldActs) Act(ctx context.Context, inst *instance.Instance, changed []string, ev instance.ActionEvent) (*instance.Refusal, error) {
	if h.asked.Load() {
		h.wait()
	}
	return h.Store.Act(ctx, inst, changed, ev)
}

// TestActionPrecedesTheStatusChangesItCauses: on the history, a start's, a stop's and a
// reboot's ACTION comes before the STATUS_CHANGED events the region's power change causes,
// however slow the API's write and fast the worker's.
func TestActionPrecedesTheStatusChangesItCauses(t *testing.T) {
	e := newEnv(t)
	inst := e.waitRunning(t, e.create(t, "web-1").ID)
	var asked atomic.Bool
	var mark string // the history's last cursor before the verb
	statusSince := func() []instance.Record {
		recs, _, err := e.st.History(bg, "acme", inst.ID, mark, 10_000)
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}
	changedSince := func() bool {
		return slices.ContainsFunc(statusSince(), func(r instance.Record) bool { return r.Kind == instance.EventStatusChanged })
	}
	held := heldActs{Store: e.st, asked: &asked, wait: func() {
		// Until the worker has recorded the region's change, or long enough that it would have.
		for deadline := time.Now().Add(convergeLimit); !changedSince() && time.Now().Before(deadline); {
			time.Sleep(3 * time.Millisecond)
		}
	}}
	svc, err := instance.NewService(instance.Options{Catalog: e.cat, Store: held, Queue: e.q, Region: askedRegion{e.region, &asked}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	// settled waits until the server and the instance are at rest in the state: every status
	// change the verb causes has been recorded by then.
	settled := func(t *testing.T, state region.ServerState, power instance.PowerState) {
		eventually.Holds(t, convergeLimit, func() bool {
			cur := e.lookup(t, inst.ID)
			return e.server(t, inst).State == state && cur != nil && cur.Status.PowerState == power && cur.Status.ObservedGeneration == cur.Generation
		}, "server %s and instance %s", state, power)
	}
	for _, v := range []struct {
		verb  verbCall
		state region.ServerState
		power instance.PowerState
		// changes: the power state always changes; a reboot may be over before the worker
		// looks, and then leaves no status change to order.
		changes bool
	}{
		{allVerbs[1], region.ServerStopped, instance.PowerStopped, true},  // stop
		{allVerbs[0], region.ServerRunning, instance.PowerRunning, true},  // start
		{allVerbs[2], region.ServerRunning, instance.PowerRunning, false}, // reboot
		{allVerbs[3], region.ServerRunning, instance.PowerRunning, false}, // hard reboot
	} {
		hist, _, err := e.st.History(bg, "acme", inst.ID, "", 10_000)
		if err != nil {
			t.Fatal(err)
		}
		mark = hist[len(hist)-1].Cursor
		asked.Store(false)
		if err := v.verb.call(svc, inst.ID); err != nil {
			t.Fatalf("%s: %v", v.verb.name, err)
		}
		if v.changes {
			eventually.Holds(t, convergeLimit, changedSince, "%s: no status change", v.verb.name)
		}
		settled(t, v.state, v.power)
		var kinds []string
		for _, r := range statusSince() {
			kinds = append(kinds, string(r.Kind)+" "+string(r.Action))
		}
		if len(kinds) == 0 || kinds[0] != "ACTION "+string(v.verb.action) {
			t.Errorf("%s: history since the verb %q, want its ACTION first", v.verb.name, kinds)
		}
	}
}

// refusingRegion refuses every start and stop, as a region whose server cannot change its
// power now.
type refusingRegion struct{ region.Client }

func (refusingRegion) StartServer(context.Context, string) (region.Server, error) {
	return region.Server{}, fmt.Errorf("%w: the host is in maintenance", region.ErrRefused)
}

func (refusingRegion) StopServer(context.Context, string) (region.Server, error) {
	return region.Server{}, fmt.Errorf("%w: the host is in maintenance", region.ErrRefused)
}

// TestRefusedPowerChangeGivesTheIntentBack: a stop the region refuses is recorded twice — the
// ACTION when asked, then the refusal with its code — and the desired power state is running
// again, as it was, its idempotency key let go; the caller gets the refusal.
func TestRefusedPowerChangeGivesTheIntentBack(t *testing.T) {
	e := newEnv(t)
	inst := e.waitRunning(t, e.create(t, "web-1").ID)
	svc, err := instance.NewService(instance.Options{Catalog: e.cat, Store: e.st, Queue: e.q, Region: refusingRegion{e.region}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	before := len(e.actions(t, inst.ID))
	key := "stop-1"
	_, err = svc.Stop(operator, inst.ID, &key)
	if got := codeOf(t, err); got != instance.CodeUnprocessable || !strings.Contains(err.Error(), "the host is in maintenance") {
		t.Fatalf("stop refused by the region: %v, want UNPROCESSABLE with the region's reason", err)
	}
	acts := e.actions(t, inst.ID)[before:]
	if len(acts) != 2 {
		t.Fatalf("%d ACTION events for one refused stop, want 2 (asked, refused): %+v", len(acts), acts)
	}
	asked, refused := acts[0], acts[1]
	if asked.Action != instance.ActionStop || asked.Outcome != "" || asked.Instance.DesiredPower() != instance.IntentStopped {
		t.Errorf("first: %s outcome %q desired %s, want STOP with no outcome, wanting STOPPED", asked.Action, asked.Outcome, asked.Instance.DesiredPower())
	}
	if refused.Action != instance.ActionStop || refused.Outcome != instance.CodeUnprocessable || refused.Instance.DesiredPower() != instance.IntentRunning ||
		!strings.Contains(refused.Message, "maintenance") {
		t.Errorf("second: %s outcome %q desired %s message %q, want STOP refused UNPROCESSABLE, wanting RUNNING again, with the reason",
			refused.Action, refused.Outcome, refused.Instance.DesiredPower(), refused.Message)
	}
	if got := e.get(t, inst.ID); got.DesiredPower() != instance.IntentRunning {
		t.Errorf("desired power %s after the refused stop, want RUNNING", got.DesiredPower())
	}
	// The refusal let go of the key with the undo: a retry with it, once the region takes
	// it, stops the instance rather than replaying a stop that did not happen. The workers'
	// region takes stops: one that read the stop's intent before the undo stopped the server,
	// and starts it again now, so the retry waits until the instance has settled running (else
	// the region refuses to stop a server already STOPPING).
	eventually.Holds(t, convergeLimit, func() bool { return e.settled(t, inst.Key()) && converged(e.lookup(t, inst.ID)) },
		"instance %s settled RUNNING after the refused stop", inst.ID)
	if got, err := e.svc.Stop(operator, inst.ID, &key); err != nil || got.DesiredPower() != instance.IntentStopped {
		t.Errorf("the refused stop retried with its key: %v, %v; want it stopped", got, err)
	}
}
