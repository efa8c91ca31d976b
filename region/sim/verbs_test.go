package sim

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/region"
)

// The operational verbs as the simulated region realises them.

// powerCall is one power action of region.Client.
type powerCall struct {
	name string
	// from is the one state the action is accepted in.
	from region.ServerState
	do   func(ctx context.Context, s *Sim, id string) (region.Server, error)
}

var powerCalls = []powerCall{
	{"stop", region.ServerRunning, func(ctx context.Context, s *Sim, id string) (region.Server, error) {
		return s.StopServer(ctx, id)
	}},
	{"start", region.ServerStopped, func(ctx context.Context, s *Sim, id string) (region.Server, error) {
		return s.StartServer(ctx, id)
	}},
	{"soft reboot", region.ServerRunning, func(ctx context.Context, s *Sim, id string) (region.Server, error) {
		return s.RebootServer(ctx, id, false)
	}},
	{"hard reboot", region.ServerRunning, func(ctx context.Context, s *Sim, id string) (region.Server, error) {
		return s.RebootServer(ctx, id, true)
	}},
}

// powerCallNamed returns the power call of the table by name.
func powerCallNamed(t *testing.T, name string) powerCall {
	t.Helper()
	i := slices.IndexFunc(powerCalls, func(c powerCall) bool { return c.name == name })
	if i < 0 {
		t.Fatalf("no power call %q", name)
	}
	return powerCalls[i]
}

// mustCreate creates a server that must be accepted.
func mustCreate(t *testing.T, s *Sim, sp region.ServerSpec) region.Server {
	t.Helper()
	srv, err := s.CreateServer(context.Background(), sp)
	if err != nil {
		t.Fatalf("CreateServer %s: %v", sp.Name, err)
	}
	return srv
}

// wantState fails the test unless the stored server is in the state.
func (e *env) wantState(t *testing.T, s *Sim, id string, want region.ServerState) region.Server {
	t.Helper()
	got := e.mustGet(t, s, id)
	if got.State != want {
		t.Fatalf("server %s (%s) is %s, want %s", id, got.Name, got.State, want)
	}
	return got
}

// dueScore is when the server's (or image's) next transition is due; ok is false when none is.
func (e *env) dueScore(t *testing.T, member string) (float64, bool) {
	t.Helper()
	score, err := e.rdb.ZScore(context.Background(), dueKey, member).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false
	}
	if err != nil {
		t.Fatalf("ZSCORE %s: %v", member, err)
	}
	return score, true
}

// TestPowerWalks: each power action, from the state it needs, returns the server in its
// transitional state at once with an updated event; the clock ends the transition exactly
// PowerDelay later (not a millisecond sooner) with one more event, and then nothing moves. The
// server keeps its id, MAC and addresses throughout.
func TestPowerWalks(t *testing.T) {
	const powerDelay = 45 * time.Second
	cases := []struct {
		call         string
		transitional region.ServerState
		settled      region.ServerState
	}{
		{"stop", region.ServerStopping, region.ServerStopped},
		{"start", region.ServerStarting, region.ServerRunning},
		{"soft reboot", region.ServerRebooting, region.ServerRunning},
		{"hard reboot", region.ServerRebooting, region.ServerRunning},
	}
	for _, tc := range cases {
		t.Run(tc.call, func(t *testing.T) {
			call := powerCallNamed(t, tc.call)
			e := newEnv(t)
			clk := newFakeClock()
			s := e.sim(Options{PowerDelay: powerDelay, Now: clk.Now})
			ctx := context.Background()
			sp := spec(t, "net-globex-prod-us", "web-1", "inst-1")
			sp.Networking.PublicIP = true
			created := mustCreate(t, s, sp)
			e.run(s)
			clk.tick(t) // BUILDING
			clk.tick(t) // RUNNING: BuildDelay is zero
			e.waitState(t, s, created.ID, region.ServerRunning)
			if call.from == region.ServerStopped {
				if _, err := s.StopServer(ctx, created.ID); err != nil {
					t.Fatalf("StopServer: %v", err)
				}
				clk.Add(powerDelay)
				clk.tick(t)
				e.wantState(t, s, created.ID, region.ServerStopped)
			}
			sameServer := func(step string, got region.Server) {
				t.Helper()
				if got.ID != created.ID || got.MAC != created.MAC || got.PrivateIP != created.PrivateIP || got.PublicIP != created.PublicIP {
					t.Errorf("%s: server %s with MAC %s and IPs %s/%s, want %s with %s and %s/%s", step,
						got.ID, got.MAC, got.PrivateIP, got.PublicIP, created.ID, created.MAC, created.PrivateIP, created.PublicIP)
				}
			}
			events := e.watch(s, "0-0")
			before := e.eventCount(t)
			for range before {
				next(t, events)
			}

			got, err := call.do(ctx, s, created.ID)
			if err != nil {
				t.Fatalf("%s: %v", tc.call, err)
			}
			if got.State != tc.transitional {
				t.Errorf("%s returned a server that is %s, want %s at once", tc.call, got.State, tc.transitional)
			}
			sameServer("returned", got)
			sameServer("stored", e.wantState(t, s, created.ID, tc.transitional))
			if ev := next(t, events); ev.Kind != region.ServerUpdated || ev.ServerID != created.ID || !maps.Equal(ev.Tags, sp.Tags) || ev.Scope != sp.Scope {
				t.Errorf("event %+v, want updated of %s with its tags and scope", ev, created.ID)
			}
			if n := e.eventCount(t); n != before+1 {
				t.Errorf("%d events after %s, want %d", n, tc.call, before+1)
			}

			steps := []struct {
				advance    time.Duration
				wantState  region.ServerState
				wantEvents int64
			}{
				{0, tc.transitional, before + 1},
				{powerDelay - time.Millisecond, tc.transitional, before + 1},
				{time.Millisecond, tc.settled, before + 2},
				{time.Hour, tc.settled, before + 2}, // settled: no more events
			}
			for i, st := range steps {
				clk.Add(st.advance)
				clk.tick(t)
				got := e.wantState(t, s, created.ID, st.wantState)
				sameServer("step", got)
				if n := e.eventCount(t); n != st.wantEvents {
					t.Fatalf("step %d (+%s): %d events, want %d", i, st.advance, n, st.wantEvents)
				}
			}
			if ev := next(t, events); ev.Kind != region.ServerUpdated || ev.ServerID != created.ID {
				t.Errorf("event %+v, want updated (%s) of %s", ev, tc.settled, created.ID)
			}
			if got := e.mustGet(t, s, created.ID); got.Health != region.HealthHealthy {
				t.Errorf("health %s after %s, want HEALTHY", got.Health, tc.call)
			}
			if _, due := e.dueScore(t, created.ID); due {
				t.Errorf("a transition is still due for the settled server")
			}
		})
	}
}

// TestPowerRefusals: every power action on a server in any state but the one it needs is
// refused with ErrRefused, in words naming the state, and changes nothing: not the server,
// not its schedule, not the event stream. An unknown server is ErrServerNotFound.
func TestPowerRefusals(t *testing.T) {
	const delay = time.Hour // long enough that nothing the test set up moves on by itself
	e := newEnv(t)
	clk := newFakeClock()
	s := e.sim(Options{BuildDelay: delay, DeleteDelay: delay, PowerDelay: delay, Now: clk.Now,
		Faults: Faults{FailBuildPrefix: "fail-"}})
	ctx := context.Background()

	// The clock runs while the servers are brought to their states and is stopped before
	// the checks, so that a PENDING server stays PENDING and nothing else moves either.
	clockCtx, stopClock := context.WithCancel(ctx)
	clockDone := make(chan error, 1)
	go func() { clockDone <- s.Run(clockCtx) }()
	halt := sync.OnceValue(func() error { stopClock(); return <-clockDone })
	t.Cleanup(func() { halt() })

	byName := map[string]string{}
	create := func(name string) {
		byName[name] = mustCreate(t, s, spec(t, "net-acme-web-eu", name, "inst-"+name)).ID
	}
	for _, name := range []string{"running", "stopped", "stopping", "starting", "rebooting", "deleting", "fail-1"} {
		create(name)
	}
	clk.tick(t) // BUILDING
	clk.Add(delay)
	clk.tick(t) // RUNNING (fail-1: ERROR)
	for _, name := range []string{"stopped", "starting"} {
		if _, err := s.StopServer(ctx, byName[name]); err != nil {
			t.Fatalf("StopServer %s: %v", name, err)
		}
	}
	clk.Add(delay)
	clk.tick(t) // STOPPED
	moves := []struct {
		name string
		do   func(id string) error
	}{
		{"starting", func(id string) error { _, err := s.StartServer(ctx, id); return err }},
		{"stopping", func(id string) error { _, err := s.StopServer(ctx, id); return err }},
		{"rebooting", func(id string) error { _, err := s.RebootServer(ctx, id, false); return err }},
		{"deleting", func(id string) error { return s.DeleteServer(ctx, id) }},
	}
	for _, m := range moves {
		if err := m.do(byName[m.name]); err != nil {
			t.Fatalf("move %s: %v", m.name, err)
		}
	}
	create("building")
	clk.tick(t) // BUILDING, due an hour later
	if err := halt(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	create("pending")

	ids := map[region.ServerState]string{
		region.ServerPending: byName["pending"], region.ServerBuilding: byName["building"],
		region.ServerRunning: byName["running"], region.ServerStopping: byName["stopping"],
		region.ServerStopped: byName["stopped"], region.ServerStarting: byName["starting"],
		region.ServerRebooting: byName["rebooting"], region.ServerDeleting: byName["deleting"],
		region.ServerError: byName["fail-1"],
	}
	states := slices.Sorted(maps.Keys(ids))
	for _, st := range states {
		e.wantState(t, s, ids[st], st)
	}

	for _, call := range powerCalls {
		for _, st := range states {
			if st == call.from {
				continue // the walk, tested by TestPowerWalks
			}
			t.Run(call.name+" "+string(st), func(t *testing.T) {
				id := ids[st]
				before := e.mustGet(t, s, id)
				beforeDue, wasDue := e.dueScore(t, id)
				events := e.eventCount(t)
				_, err := call.do(ctx, s, id)
				if !errors.Is(err, region.ErrRefused) {
					t.Fatalf("%s of a %s server: %v, want an error wrapping ErrRefused", call.name, st, err)
				}
				if !strings.Contains(err.Error(), string(st)) {
					t.Errorf("refusal %q does not name the state %s", err, st)
				}
				if after := e.mustGet(t, s, id); !reflect.DeepEqual(after, before) {
					t.Errorf("refused %s changed the server:\n%+v\nwas\n%+v", call.name, after, before)
				}
				if due, isDue := e.dueScore(t, id); isDue != wasDue || due != beforeDue {
					t.Errorf("refused %s changed the schedule: due %v (%v), was %v (%v)", call.name, due, isDue, beforeDue, wasDue)
				}
				if n := e.eventCount(t); n != events {
					t.Errorf("refused %s recorded %d events", call.name, n-events)
				}
			})
		}
	}

	t.Run("unknown server", func(t *testing.T) {
		events := e.eventCount(t)
		for _, call := range powerCalls {
			_, err := call.do(ctx, s, "no-such-server")
			if !errors.Is(err, region.ErrServerNotFound) || errors.Is(err, region.ErrRefused) {
				t.Errorf("%s of an unknown server: %v, want ErrServerNotFound (and not ErrRefused)", call.name, err)
			}
		}
		if n := e.eventCount(t); n != events {
			t.Errorf("power actions on an unknown server recorded %d events", n-events)
		}
		if _, err := e.get(t, s, "no-such-server"); !errors.Is(err, region.ErrServerNotFound) {
			t.Errorf("a power action made the unknown server: %v", err)
		}
	})
}

// TestGetServer: the stored server, ErrServerNotFound for an unknown id, ErrUnavailable when
// the region fails.
func TestGetServer(t *testing.T) {
	e := newEnv(t)
	s := e.sim(Options{})
	ctx := context.Background()
	sp := spec(t, "net-acme-web-eu", "web-1", "inst-1")
	created := mustCreate(t, s, sp)

	got, err := s.GetServer(ctx, created.ID)
	if err != nil {
		t.Fatalf("GetServer: %v", err)
	}
	if want := e.mustGet(t, s, created.ID); !reflect.DeepEqual(got, want) {
		t.Errorf("GetServer returned\n%+v\nthe region holds\n%+v", got, want)
	}
	if got.ID != created.ID || got.Name != sp.Name || got.MAC != created.MAC || got.PrivateIP != created.PrivateIP ||
		got.Scope != sp.Scope || !maps.Equal(got.Tags, sp.Tags) || got.State != region.ServerPending {
		t.Errorf("GetServer returned %+v, want the server created as %+v", got, created)
	}

	if _, err := s.GetServer(ctx, "no-such-server"); !errors.Is(err, region.ErrServerNotFound) {
		t.Errorf("GetServer of an unknown id: %v, want ErrServerNotFound", err)
	}
	faulty := e.sim(Options{Faults: Faults{ErrorRate: 1}})
	if _, err := faulty.GetServer(ctx, created.ID); !errors.Is(err, region.ErrUnavailable) {
		t.Errorf("GetServer of a failing region: %v, want ErrUnavailable", err)
	}
}

// TestVerbsUnavailable: with ErrorRate 1 every verb fails with ErrUnavailable and changes
// nothing: no state, no event, no key pair, no image.
func TestVerbsUnavailable(t *testing.T) {
	e := newEnv(t)
	healthy := e.sim(Options{})
	faulty := e.sim(Options{Faults: Faults{ErrorRate: 1}})
	ctx := context.Background()
	e.run(healthy)
	srv := mustCreate(t, healthy, spec(t, "net-acme-web-eu", "web-1", "inst-1"))
	e.waitState(t, healthy, srv.ID, region.ServerRunning)
	before := e.mustGet(t, healthy, srv.ID)
	events := e.eventCount(t)

	type verb struct {
		name string
		do   func() error
	}
	verbs := []verb{
		{"GetServer", func() error { _, err := faulty.GetServer(ctx, srv.ID); return err }},
		{"OpenConsole", func() error { _, err := faulty.OpenConsole(ctx, srv.ID); return err }},
		{"SSHKey", func() error { _, err := faulty.SSHKey(ctx, srv.ID); return err }},
		{"Snapshot", func() error { _, err := faulty.Snapshot(ctx, srv.ID, region.ImageRequest{Name: "snap"}); return err }},
		{"Images", func() error { _, err := faulty.Images(ctx, srv.OrganizationID, srv.ProjectID); return err }},
	}
	for _, c := range powerCalls {
		verbs = append(verbs, verb{c.name, func() error { _, err := c.do(ctx, faulty, srv.ID); return err }})
	}
	for _, v := range verbs {
		t.Run(v.name, func(t *testing.T) {
			for range 10 {
				if err := v.do(); !errors.Is(err, region.ErrUnavailable) {
					t.Fatalf("%s: %v, want an error wrapping ErrUnavailable", v.name, err)
				}
			}
		})
	}
	if after := e.mustGet(t, healthy, srv.ID); !reflect.DeepEqual(after, before) {
		t.Errorf("failed calls changed the server: %+v, was %+v", after, before)
	}
	if n := e.eventCount(t); n != events {
		t.Errorf("failed calls recorded %d events", n-events)
	}
	if n, err := e.rdb.Exists(ctx, sshKeyKey(srv.OrganizationID, srv.ProjectID)).Result(); err != nil || n != 0 {
		t.Errorf("a failed SSHKey made the project's key pair (%d, %v)", n, err)
	}
	if imgs, err := healthy.Images(ctx, srv.OrganizationID, srv.ProjectID); err != nil || len(imgs) != 0 {
		t.Errorf("a failed Snapshot made images: %+v (%v)", imgs, err)
	}
}

// TestOpenConsole: a RUNNING server's console echoes what is typed, a carriage return as a
// new line; a newer attachment ends an older one's reads; Close ends reads; a server that is not RUNNING is
// refused, naming its state; opening records no event.
func TestOpenConsole(t *testing.T) {
	const powerDelay = time.Minute
	e := newEnv(t)
	clk := newFakeClock()
	s := e.sim(Options{PowerDelay: powerDelay, Now: clk.Now})
	ctx := context.Background()
	srv := mustCreate(t, s, spec(t, "net-acme-web-eu", "web-1", "inst-1"))
	e.run(s)
	clk.tick(t)
	clk.tick(t)
	e.waitState(t, s, srv.ID, region.ServerRunning)
	events := e.eventCount(t)

	first, err := s.OpenConsole(ctx, srv.ID)
	if err != nil {
		t.Fatalf("OpenConsole: %v", err)
	}
	for _, typed := range []struct{ in, want string }{{"ls\r", "ls\r\n"}, {"é", "é"}} {
		if n, err := first.Write([]byte(typed.in)); err != nil || n != len(typed.in) {
			t.Fatalf("Write %q: %d, %v", typed.in, n, err)
		}
		buf := make([]byte, 64)
		n, err := first.Read(buf)
		if err != nil || string(buf[:n]) != typed.want {
			t.Errorf("typed %q, read back %q (%v), want %q", typed.in, buf[:n], err, typed.want)
		}
	}
	// A second attachment takes the console: the first's reads end.
	second, err := s.OpenConsole(ctx, srv.ID)
	if err != nil {
		t.Fatalf("second OpenConsole: %v", err)
	}
	if _, err := first.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("the first attachment's read after a second one: %v, want io.EOF", err)
	}
	first.Close() // closing the older one leaves the newer one attached
	second.Write([]byte("x"))
	if buf := make([]byte, 8); func() string { n, _ := second.Read(buf); return string(buf[:n]) }() != "x" {
		t.Errorf("the second attachment does not echo")
	}
	if err := second.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := second.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("Read after Close: %v, want io.EOF", err)
	}
	if n := e.eventCount(t); n != events {
		t.Errorf("consoles recorded %d events", n-events)
	}

	if _, err := s.StopServer(ctx, srv.ID); err != nil {
		t.Fatalf("StopServer: %v", err)
	}
	refusals := []struct {
		advance time.Duration
		state   region.ServerState
	}{
		{0, region.ServerStopping},
		{powerDelay, region.ServerStopped},
	}
	for _, r := range refusals {
		clk.Add(r.advance)
		clk.tick(t)
		e.wantState(t, s, srv.ID, r.state)
		_, err := s.OpenConsole(ctx, srv.ID)
		if !errors.Is(err, region.ErrRefused) || !strings.Contains(err.Error(), string(r.state)) {
			t.Errorf("console of a %s server: %v, want ErrRefused naming %s", r.state, err, r.state)
		}
	}
	if _, err := s.OpenConsole(ctx, "no-such-server"); !errors.Is(err, region.ErrServerNotFound) {
		t.Errorf("console of an unknown server: %v, want ErrServerNotFound", err)
	}
}

// parseSSHKey decodes the key as a PEM "PRIVATE KEY" block holding a PKCS #8 ed25519 key.
func parseSSHKey(t *testing.T, key string) ed25519.PrivateKey {
	t.Helper()
	block, rest := pem.Decode([]byte(key))
	if block == nil || block.Type != "PRIVATE KEY" || strings.TrimSpace(string(rest)) != "" {
		t.Fatalf("key %q is not one PEM PRIVATE KEY block", key)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatalf("parse PKCS #8 key: %v", err)
	}
	private, ok := parsed.(ed25519.PrivateKey)
	if !ok || len(private) != ed25519.PrivateKeySize {
		t.Fatalf("key is a %T, want an ed25519.PrivateKey", parsed)
	}
	return private
}

// TestSSHKey: one ed25519 key pair per project, whatever the server or its region, made on
// first use (once, even when first asked for by many at once); a server of an SSH certificate
// authority is refused.
func TestSSHKey(t *testing.T) {
	e := newEnv(t)
	s := e.sim(Options{})
	ctx := context.Background()
	key := func(t *testing.T, id string) string {
		t.Helper()
		k, err := s.SSHKey(ctx, id)
		if err != nil {
			t.Fatalf("SSHKey %s: %v", id, err)
		}
		parseSSHKey(t, k.PrivateKey)
		return k.PrivateKey
	}
	webEU := mustCreate(t, s, spec(t, "net-acme-web-eu", "web-1", "inst-1"))
	webUS := mustCreate(t, s, spec(t, "net-acme-web-us", "web-2", "inst-2"))
	data := mustCreate(t, s, spec(t, "net-acme-data-eu", "data-1", "inst-3"))
	globex := mustCreate(t, s, spec(t, "net-globex-prod-eu", "prod-1", "inst-4"))
	caSpec := spec(t, "net-acme-web-eu", "web-ca", "inst-5")
	caSpec.SSHCertificateAuthorityID = "ca-acme-web"
	withCA := mustCreate(t, s, caSpec)

	t.Run("one key pair per project", func(t *testing.T) {
		web := key(t, webEU.ID)
		if again := key(t, webEU.ID); again != web {
			t.Errorf("the same server's key changed between two calls")
		}
		if other := key(t, webUS.ID); other != web {
			t.Errorf("two servers of acme/web got different keys")
		}
		dataKey, globexKey := key(t, data.ID), key(t, globex.ID)
		if dataKey == web || globexKey == web || dataKey == globexKey {
			t.Errorf("different projects share a key: acme/web %t acme/data, acme/web %t globex/prod, acme/data %t globex/prod",
				dataKey == web, globexKey == web, dataKey == globexKey)
		}
		if stored, err := e.rdb.Get(ctx, sshKeyKey("acme", "web")).Result(); err != nil || stored != web {
			t.Errorf("stored key pair of acme/web differs from the one returned (%v)", err)
		}
	})

	t.Run("certificate authority", func(t *testing.T) {
		_, err := s.SSHKey(ctx, withCA.ID)
		if !errors.Is(err, region.ErrRefused) || !strings.Contains(err.Error(), "ca-acme-web") {
			t.Errorf("SSHKey of a server of a CA: %v, want ErrRefused naming the CA", err)
		}
	})

	t.Run("unknown server", func(t *testing.T) {
		if _, err := s.SSHKey(ctx, "no-such-server"); !errors.Is(err, region.ErrServerNotFound) {
			t.Errorf("SSHKey of an unknown server: %v, want ErrServerNotFound", err)
		}
	})

	t.Run("concurrent first use", func(t *testing.T) {
		const n = 10
		// A project nobody asked yet, with servers in two regions.
		servers := []region.Server{
			mustCreate(t, s, spec(t, "net-globex-staging-eu", "stg-1", "inst-6")),
			mustCreate(t, s, spec(t, "net-globex-staging-us", "stg-2", "inst-7")),
		}
		keys := make([]string, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				var k region.SSHKey
				k, errs[i] = s.SSHKey(ctx, servers[i%len(servers)].ID)
				keys[i] = k.PrivateKey
			})
		}
		close(start)
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("request %d: %v", i, errs[i])
			}
			if keys[i] != keys[0] {
				t.Errorf("request %d got a different key than request 0", i)
			}
		}
		parseSSHKey(t, keys[0])
		if later := key(t, servers[0].ID); later != keys[0] {
			t.Errorf("the key changed after the first requests")
		}
	})
}

// TestSnapshot: a RUNNING or STOPPED server can be snapshotted, a provisioning one cannot;
// the image is CREATING at once, named and tagged as asked, owned by the server's project in
// the server's region, shaped like the server's catalogue image; the clock makes it READY
// PowerDelay later. Only its own project lists it.
func TestSnapshot(t *testing.T) {
	const (
		buildDelay = time.Hour
		powerDelay = time.Minute
	)
	e := newEnv(t)
	clk := newFakeClock()
	cat := region.Demo()
	s := e.sim(Options{Catalog: cat, BuildDelay: buildDelay, PowerDelay: powerDelay, Now: clk.Now})
	ctx := context.Background()
	withImage := func(sp region.ServerSpec, image string) region.ServerSpec { sp.ImageID = image; return sp }
	running := mustCreate(t, s, withImage(spec(t, "net-acme-web-eu", "web-1", "inst-1"), "debian-12-metal"))
	stopped := mustCreate(t, s, withImage(spec(t, "net-acme-web-us", "web-2", "inst-2"), "ubuntu-24.04-arm"))
	orphan := mustCreate(t, s, withImage(spec(t, "net-acme-web-eu", "web-3", "inst-3"), "no-such-image"))
	e.run(s)
	clk.tick(t) // BUILDING
	clk.Add(buildDelay)
	clk.tick(t) // RUNNING
	if _, err := s.StopServer(ctx, stopped.ID); err != nil {
		t.Fatalf("StopServer: %v", err)
	}
	clk.Add(powerDelay)
	clk.tick(t) // STOPPED
	building := mustCreate(t, s, spec(t, "net-acme-web-eu", "web-4", "inst-4"))
	clk.tick(t) // BUILDING, for an hour
	e.wantState(t, s, running.ID, region.ServerRunning)
	e.wantState(t, s, stopped.ID, region.ServerStopped)
	e.wantState(t, s, orphan.ID, region.ServerRunning)
	e.wantState(t, s, building.ID, region.ServerBuilding)

	images := func(t *testing.T, org, project string) map[string]region.Image {
		t.Helper()
		list, err := s.Images(ctx, org, project)
		if err != nil {
			t.Fatalf("Images(%s, %s): %v", org, project, err)
		}
		out := map[string]region.Image{}
		for _, img := range list {
			out[img.ID] = img
		}
		return out
	}

	refusals := []struct {
		name string
		id   string
		says string
	}{
		{"building server", building.ID, string(region.ServerBuilding)},
		{"server of an image gone from the catalogue", orphan.ID, "no-such-image"},
	}
	for _, r := range refusals {
		_, err := s.Snapshot(ctx, r.id, region.ImageRequest{Name: "nope"})
		if !errors.Is(err, region.ErrRefused) || !strings.Contains(err.Error(), r.says) {
			t.Errorf("snapshot of a %s: %v, want ErrRefused naming %s", r.name, err, r.says)
		}
	}
	if _, err := s.Snapshot(ctx, "no-such-server", region.ImageRequest{Name: "nope"}); !errors.Is(err, region.ErrServerNotFound) {
		t.Errorf("snapshot of an unknown server: %v, want ErrServerNotFound", err)
	}
	if got := images(t, "acme", "web"); len(got) != 0 {
		t.Fatalf("refused snapshots made images: %+v", got)
	}

	cases := []struct {
		name   string
		server region.Server
		state  region.ServerState
		req    region.ImageRequest
	}{
		{"running", running, region.ServerRunning, region.ImageRequest{Name: "web-1 nightly", Tags: map[string]string{"purpose": "backup"}}},
		{"stopped", stopped, region.ServerStopped, region.ImageRequest{Name: "web-2 cold", Tags: map[string]string{"purpose": "cold", "tier": "2"}}},
	}
	made := map[string]region.Image{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			img, err := s.Snapshot(ctx, tc.server.ID, tc.req)
			if err != nil {
				t.Fatalf("Snapshot: %v", err)
			}
			base, ok := cat.Image(tc.server.ImageID)
			if !ok {
				t.Fatalf("no catalogue image %s", tc.server.ImageID)
			}
			if img.ID == "" || made[img.ID].ID != "" {
				t.Errorf("image id %q, want a new one", img.ID)
			}
			if img.State != region.ImageStateCreating {
				t.Errorf("state %s, want %s at once", img.State, region.ImageStateCreating)
			}
			if img.Name != tc.req.Name || !maps.Equal(img.Tags, tc.req.Tags) {
				t.Errorf("name %q tags %v, want %q %v", img.Name, img.Tags, tc.req.Name, tc.req.Tags)
			}
			if img.OrganizationID != tc.server.OrganizationID || img.ProjectID != tc.server.ProjectID ||
				!slices.Equal(img.Regions, []string{tc.server.RegionID}) {
				t.Errorf("owned by %s/%s in %v, want %s/%s in [%s]", img.OrganizationID, img.ProjectID, img.Regions,
					tc.server.OrganizationID, tc.server.ProjectID, tc.server.RegionID)
			}
			flavor, ok := cat.Flavor(tc.server.FlavorID)
			if !ok {
				t.Fatalf("no catalogue flavor %s", tc.server.FlavorID)
			}
			// The catalogue image's shape, the size of the server's disk.
			if img.Architecture != base.Architecture || img.SizeGiB != region.DiskGiB(flavor.DiskGB) || img.Virtualization != base.Virtualization ||
				!reflect.DeepEqual(img.OS, base.OS) {
				t.Errorf("shape %s/%d GiB/%s/%+v, want the catalogue image's %s/%s/%+v and the disk's %d GiB", img.Architecture, img.SizeGiB,
					img.Virtualization, img.OS, base.Architecture, base.Virtualization, base.OS, region.DiskGiB(flavor.DiskGB))
			}
			if listed, ok := images(t, "acme", "web")[img.ID]; !ok || !reflect.DeepEqual(listed, img) {
				t.Errorf("Images lists %+v (%v), want the image as returned %+v", listed, ok, img)
			}
			e.wantState(t, s, tc.server.ID, tc.state) // the server does not move
			made[img.ID] = img
		})
	}
	if len(made) != len(cases) {
		t.Fatalf("%d images made, want %d", len(made), len(cases))
	}
	// An image being made cannot be deleted.
	for id := range made {
		if err := s.DeleteImage(ctx, "acme", "web", id); !errors.Is(err, region.ErrRefused) {
			t.Errorf("DeleteImage of image %s being made: %v, want ErrRefused", id, err)
		}
	}

	steps := []struct {
		advance time.Duration
		want    region.ImageState
	}{
		{powerDelay - time.Millisecond, region.ImageStateCreating},
		{time.Millisecond, region.ImageStateReady},
	}
	for i, st := range steps {
		clk.Add(st.advance)
		clk.tick(t)
		got := images(t, "acme", "web")
		if len(got) != len(made) {
			t.Fatalf("step %d: Images lists %d images, want %d", i, len(got), len(made))
		}
		for id, img := range made {
			want := img
			want.State = st.want
			if !reflect.DeepEqual(got[id], want) {
				t.Errorf("step %d (+%s): image %+v, want %+v", i, st.advance, got[id], want)
			}
		}
	}
	for id := range made {
		if _, due := e.dueScore(t, imageDuePrefix+id); due {
			t.Errorf("image %s is READY and still due", id)
		}
	}
	for _, other := range [][2]string{{"acme", "data"}, {"globex", "web"}, {"globex", "prod"}} {
		if got := images(t, other[0], other[1]); len(got) != 0 {
			t.Errorf("Images(%s, %s) lists another project's images: %+v", other[0], other[1], got)
		}
	}
}
