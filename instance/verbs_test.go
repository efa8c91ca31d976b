package instance_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/store"
)

// The operational verbs at the service level: who may call them, and what input they refuse.
// Their effects through workers and the API are tested in worker/ and server/.

// runClock drives the region's clock until the test ends.
func (e *env) runClock(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.region.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("region clock: %v", err)
		}
	})
}

// backed creates an instance and gives it one server in the region in state want (RUNNING or
// STOPPED), made as a worker would make it; the region's clock must be running. No worker runs
// here, so the instance itself stays PENDING: the verbs act on the server they find.
func (e *env) backed(t testing.TB, name string, want region.ServerState) (*instance.Instance, region.Server) {
	t.Helper()
	req := validCreate()
	req.Name = name
	inst := e.create(t, acmeMember, req)
	srv, err := e.region.CreateServer(context.Background(), inst.ServerSpec())
	if err != nil {
		t.Fatal(err)
	}
	e.waitServer(t, srv.ID, region.ServerRunning)
	if want == region.ServerStopped {
		if _, err := e.region.StopServer(context.Background(), srv.ID); err != nil {
			t.Fatal(err)
		}
		e.waitServer(t, srv.ID, region.ServerStopped)
	}
	srv, err = e.region.GetServer(context.Background(), srv.ID)
	if err != nil {
		t.Fatal(err)
	}
	return inst, srv
}

// waitServer waits until the server is in the state.
func (e *env) waitServer(t testing.TB, id string, want region.ServerState) {
	t.Helper()
	var last region.ServerState
	eventually.Holds(t, 10*time.Second, func() bool {
		srv, err := e.region.GetServer(context.Background(), id)
		if err != nil {
			t.Fatalf("get server %s: %v", id, err)
		}
		last = srv.State
		return last == want
	}, "server %s %s, last %s", id, want, &last)
}

// actions returns the ACTION events of the instance's history.
func (e *env) actions(t testing.TB, id string) []instance.Record {
	t.Helper()
	page, err := e.svc.History(acmeAdmin, id, ptr(instance.MaxPageSize), nil)
	if err != nil {
		t.Fatalf("history of %s: %v", id, err)
	}
	var out []instance.Record
	for _, r := range page.Events {
		if r.Kind == instance.EventAction {
			out = append(out, r)
		}
	}
	return out
}

// verb is one operational verb as a test calls it.
type verb struct {
	name   string
	action instance.Action
	// on is the server state in which the region accepts the verb.
	on   region.ServerState
	call func(ctx context.Context, id string) error
}

func verbs(svc *instance.Service) []verb {
	return []verb{
		{"start", instance.ActionStart, region.ServerStopped, func(ctx context.Context, id string) error {
			_, err := svc.Start(ctx, id, nil)
			return err
		}},
		{"stop", instance.ActionStop, region.ServerRunning, func(ctx context.Context, id string) error {
			_, err := svc.Stop(ctx, id, nil)
			return err
		}},
		{"reboot", instance.ActionReboot, region.ServerRunning, func(ctx context.Context, id string) error {
			_, err := svc.Reboot(ctx, id, false, nil)
			return err
		}},
		{"hard reboot", instance.ActionHardReboot, region.ServerRunning, func(ctx context.Context, id string) error {
			_, err := svc.Reboot(ctx, id, true, nil)
			return err
		}},
		{"console", instance.ActionConsole, region.ServerRunning, func(ctx context.Context, id string) error {
			_, err := svc.Console(ctx, id, nil)
			return err
		}},
		{"ssh key", instance.ActionSSHKey, region.ServerRunning, func(ctx context.Context, id string) error {
			_, err := svc.SSHKey(ctx, id)
			return err
		}},
		{"snapshot", instance.ActionSnapshot, region.ServerRunning, func(ctx context.Context, id string) error {
			_, err := svc.Snapshot(ctx, instance.SnapshotRequest{ID: id, Name: "snap"})
			return err
		}},
	}
}

// Every verb needs operator. A reader below it is FORBIDDEN; a caller who
// cannot see the instance gets NOT_FOUND, so ids do not leak. A refused caller reaches neither
// the region nor the history; an allowed one does both, recorded as the actor.
func TestVerbsNeedOperator(t *testing.T) {
	e := newEnv(t)
	e.unlimited(t, "acme")
	e.runClock(t)
	callers := []struct {
		name string
		ctx  context.Context
		want instance.Code // "" for allowed
	}{
		{"project viewer", acmeViewer, instance.CodeForbidden},
		{"organization-wide viewer", as("vivian", "acme", "", auth.RoleViewer), instance.CodeForbidden},
		{"no grant at all", asGrants("nemo"), instance.CodeNotFound},
		{"member of another project", as("dana", "acme", "data", auth.RoleMember), instance.CodeNotFound},
		{"admin of another organization", globexAdmin, instance.CodeNotFound},
		{"no principal", nobody, instance.CodeUnauthenticated},
		{"operator", acmeOperator, ""},
		{"member", acmeMember, ""},
		{"organization admin", acmeAdmin, ""},
	}
	n := 0
	for _, v := range verbs(e.svc) {
		t.Run(v.name, func(t *testing.T) {
			for _, c := range callers {
				t.Run(c.name, func(t *testing.T) {
					n++
					inst, before := e.backed(t, fmt.Sprintf("auth-%d", n), v.on)
					err := v.call(c.ctx, inst.ID)
					srv, gerr := e.region.GetServer(context.Background(), before.ID)
					if gerr != nil {
						t.Fatal(gerr)
					}
					acts := e.actions(t, inst.ID)
					if c.want != "" {
						wantCode(t, err, c.want)
						if len(acts) != 0 {
							t.Errorf("a refused caller was recorded: %+v", acts)
						}
						if srv.State != before.State {
							t.Errorf("a refused caller changed the server: %s -> %s", before.State, srv.State)
						}
						if imgs, _ := e.region.Images(context.Background(), "acme", "web"); len(imgs) != 0 {
							t.Errorf("a refused caller made images: %+v", imgs)
						}
						return
					}
					if err != nil {
						t.Fatalf("%s by %s: %v", v.name, c.name, err)
					}
					pr, _ := instance.Principal(c.ctx)
					if len(acts) != 1 || acts[0].Actor != pr.Subject || acts[0].Action != v.action || acts[0].Outcome != "" || acts[0].Message == "" {
						t.Errorf("recorded %+v, want one %s by %s that succeeded", acts, v.action, pr.Subject)
					}
				})
			}
		})
	}
}

// A snapshot's name follows the instance name rule, and its tags the tag
// rules, reported as BAD_USER_INPUT at the offending input field: caller tags under the
// reserved prefix are dropped silently, and do not shift where the others' problems are
// reported. Malformed requests reach neither the region nor the history; and a caller who may
// not act on the instance learns that first, not what is wrong with the input.
func TestSnapshotInputIsValidated(t *testing.T) {
	e := newEnv(t)
	e.runClock(t)
	inst, _ := e.backed(t, "snapped", region.ServerRunning)
	tests := []struct {
		name string
		req  instance.SnapshotRequest
		want []problem
	}{
		{"empty name", instance.SnapshotRequest{Name: ""}, []problem{p(BadInput, "name")}},
		{"name starting with a dash", instance.SnapshotRequest{Name: "-snap"}, []problem{p(BadInput, "name")}},
		{"name with a space", instance.SnapshotRequest{Name: "my snap"}, []problem{p(BadInput, "name")}},
		{"name too long", instance.SnapshotRequest{Name: strings.Repeat("s", 64)}, []problem{p(BadInput, "name")}},
		{"empty tag name", instance.SnapshotRequest{Name: "snap", Tags: []instance.Tag{{Name: "", Value: "x"}}},
			[]problem{p(BadInput, "tags", "0", "name")}},
		{"empty tag name after a reserved one", instance.SnapshotRequest{Name: "snap",
			Tags: []instance.Tag{{Name: "compute/evil", Value: "x"}, {Name: "team", Value: "a"}, {Name: "", Value: "y"}}},
			[]problem{p(BadInput, "tags", "2", "name")}},
		{"tag given twice", instance.SnapshotRequest{Name: "snap",
			Tags: []instance.Tag{{Name: "compute/x", Value: "1"}, {Name: "team", Value: "a"}, {Name: "team", Value: "b"}}},
			[]problem{p(BadInput, "tags", "2", "name")}},
		{"tag value too long", instance.SnapshotRequest{Name: "snap",
			Tags: []instance.Tag{{Name: "team", Value: strings.Repeat("v", instance.MaxTagValue+1)}}},
			[]problem{p(BadInput, "tags", "0", "value")}},
		{"every problem at once", instance.SnapshotRequest{Name: "",
			Tags: []instance.Tag{{Name: "compute/evil", Value: "x"}, {Name: "", Value: "y"}}},
			[]problem{p(BadInput, "name"), p(BadInput, "tags", "1", "name")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.ID = inst.ID
			_, err := e.svc.Snapshot(acmeOperator, tt.req)
			wantProblems(t, err, tt.want...)

			// Callers who may not act on the instance are told that instead.
			for _, c := range []struct {
				ctx  context.Context
				want instance.Code
			}{{acmeViewer, instance.CodeForbidden}, {globexAdmin, instance.CodeNotFound}, {asGrants("nemo"), instance.CodeNotFound}} {
				_, err := e.svc.Snapshot(c.ctx, tt.req)
				wantCode(t, err, c.want)
			}
		})
	}
	if acts := e.actions(t, inst.ID); len(acts) != 0 {
		t.Errorf("malformed snapshots were recorded as actions: %+v", acts)
	}
	if imgs, err := e.region.Images(context.Background(), "acme", "web"); err != nil || len(imgs) != 0 {
		t.Errorf("malformed snapshots reached the region: %+v, %v", imgs, err)
	}

	// A malformed instance id is the caller's input too.
	_, err := e.svc.Snapshot(acmeOperator, instance.SnapshotRequest{ID: "nope", Name: "snap"})
	wantCode(t, err, instance.CodeBadUserInput)
}

// A snapshot keeps the caller's tags but those under the reserved prefix, and
// carries the instance it was made from, whatever the caller claimed.
func TestSnapshotTagsCarryTheSourceInstance(t *testing.T) {
	e := newEnv(t)
	e.runClock(t)
	inst, _ := e.backed(t, "tagged", region.ServerRunning)
	img, err := e.svc.Snapshot(acmeOperator, instance.SnapshotRequest{ID: inst.ID, Name: "tagged-snap", Tags: []instance.Tag{
		{Name: "team", Value: "web"},
		{Name: "compute/evil", Value: "x"},
		{Name: instance.ProvenanceTag, Value: "00000000-0000-0000-0000-000000000000"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"team": "web", instance.ProvenanceTag: inst.ID}
	if !maps.Equal(img.Tags, want) {
		t.Errorf("image tags %v, want %v", img.Tags, want)
	}
	imgs, err := e.region.Images(context.Background(), "acme", "web")
	if err != nil || len(imgs) != 1 || imgs[0].ID != img.ID || !maps.Equal(imgs[0].Tags, want) {
		t.Errorf("the region holds %+v (%v), want the one image with tags %v", imgs, err, want)
	}
	if img.Name != "tagged-snap" || img.OrganizationID != "acme" || img.ProjectID != "web" || img.State != region.ImageStateCreating {
		t.Errorf("image %+v, want tagged-snap of acme/web, CREATING", img)
	}
}

// A verb on an instance that does not exist is NOT_FOUND, for everyone.
func TestVerbsOnAMissingInstance(t *testing.T) {
	e := newEnv(t)
	missing := "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f"
	for _, v := range verbs(e.svc) {
		err := v.call(acmeAdmin, missing)
		var ie *instance.Error
		if !errors.As(err, &ie) || ie.Code != instance.CodeNotFound {
			t.Errorf("%s of a missing instance: %v, want NOT_FOUND", v.name, err)
		}
	}
}

// The SSH key is only for servers that use the project key pair. An instance
// with an SSH certificate authority is refused by the service itself, explaining why, even if
// its server would hand out a key (here one made without the authority, as a region that
// ignored it would have).
func TestSSHKeyRefusedForAnInstanceWithACertificateAuthority(t *testing.T) {
	e := newEnv(t)
	e.runClock(t)
	req := validCreate()
	req.Name = "with-ca"
	req.SSHCertificateAuthorityID = ptr("ca-acme-web")
	inst := e.create(t, acmeMember, req)
	spec := inst.ServerSpec()
	spec.SSHCertificateAuthorityID = ""
	srv, err := e.region.CreateServer(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	e.waitServer(t, srv.ID, region.ServerRunning)
	if _, err := e.region.SSHKey(context.Background(), srv.ID); err != nil {
		t.Fatalf("the server would not hand out a key: %v", err)
	}

	key, err := e.svc.SSHKey(acmeOperator, inst.ID)
	wantCode(t, err, instance.CodeUnprocessable)
	if key.PrivateKey != "" {
		t.Error("a key was returned with the refusal")
	}
	if msg := err.Error(); !strings.Contains(msg, "ca-acme-web") || !strings.Contains(msg, "certificate") {
		t.Errorf("refusal %q does not explain the certificate authority", msg)
	}
	if acts := e.actions(t, inst.ID); len(acts) != 1 || acts[0].Action != instance.ActionSSHKey || acts[0].Outcome != instance.CodeUnprocessable {
		t.Errorf("recorded %+v, want one SSH_KEY refused as UNPROCESSABLE", acts)
	}
}

// foundThenGone is a region whose one server of every instance is RUNNING when found and gone
// when stopped: a stop fails after it wrote its intent.
type foundThenGone struct{ region.Client }

func (foundThenGone) FindServers(_ context.Context, _ region.Scope, _, value string) ([]region.Server, error) {
	return []region.Server{{ID: "srv-" + value, State: region.ServerRunning}}, nil
}

func (foundThenGone) StopServer(context.Context, string) (region.Server, error) {
	return region.Server{}, region.ErrServerNotFound
}

// A stop the region fails puts the intent back and asks the workers to reconcile: one may have
// acted on the intent while it was written (stopped the server, or built its replacement
// stopped), and without a run it would stay so until the next resync.
func TestFailedPowerVerbPutsTheIntentBackAndEnqueues(t *testing.T) {
	e := newEnv(t)
	created, err := e.svc.Create(acmeMember, validCreate())
	if err != nil {
		t.Fatal(err)
	}
	svc, err := instance.NewService(instance.Options{
		Catalog: region.Demo(), Store: store.New(e.rdb), Queue: e.q, Region: foundThenGone{e.region},
		Now: func() time.Time { return e.now }, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.q.mu.Lock()
	before := e.q.calls[created.Key()]
	e.q.mu.Unlock()

	_, err = svc.Stop(acmeOperator, created.ID, nil)
	if code := instance.CodeOf(err); code != instance.CodeNotFound {
		t.Fatalf("stop of a server gone: %v, want NOT_FOUND", err)
	}
	got, err := e.svc.Get(acmeOperator, created.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.DesiredPower() != instance.IntentRunning {
		t.Errorf("desired power after the failed stop: %s, want RUNNING again", got.DesiredPower())
	}
	e.q.mu.Lock()
	after := e.q.calls[created.Key()]
	e.q.mu.Unlock()
	if after != before+1 {
		t.Errorf("enqueued %d times by the failed stop, want once", after-before)
	}
}
