package regiontest_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/regiontest"
	"github.com/computeql/computeql/region/sim"
)

var redisServer *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &redisServer) }

// harness is the contract's harness over a clocked simulator with the demo catalogue, the
// client it is given by wrap (a driver broken on purpose, or the simulator itself).
func harness(t *testing.T, timeout time.Duration, wrap func(*sim.Sim) region.Client) regiontest.Harness {
	t.Helper()
	cat := region.Demo()
	s, err := sim.New(redisServer.Client(t), sim.Options{Catalog: cat, Tick: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(cancel)
	wg.Go(func() {
		if err := s.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	var n atomic.Int64
	return regiontest.Harness{
		Client:  wrap(s),
		Catalog: cat,
		Spec: func(name string) region.ServerSpec {
			return region.ServerSpec{
				Scope: region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: "eu-west", NetworkID: "net-acme-web-eu"},
				Name:  name, FlavorID: "g1.small", ImageID: "ubuntu-24.04",
				Networking: region.ServerNetworking{SecurityGroupIDs: []string{"sg-acme-web-eu-ssh"}},
				Tags:       map[string]string{region.InstanceTag: fmt.Sprintf("i-%d", n.Add(1)), "team": "web"},
			}
		},
		Timeout:      timeout,
		Capabilities: regiontest.Capabilities{Snapshots: true, PublicIPs: true},
		ResizeFlavor: "g1.medium",
	}
}

func TestSimulatorKeepsTheContract(t *testing.T) {
	regiontest.Run(t, harness(t, 5*time.Second, func(s *sim.Sim) region.Client { return s }))
}

// TestSimulatorWithoutCapabilities: told the simulator offers none of them, the suite fails it
// where it does offer them, since it must then refuse them.
func TestSimulatorWithoutCapabilities(t *testing.T) {
	if os.Getenv(mutantEnv) == "no capabilities" {
		h := harness(t, time.Second, func(s *sim.Sim) region.Client { return s })
		h.Capabilities = regiontest.Capabilities{}
		regiontest.Run(t, h)
		return
	}
	out := runChild(t, "TestSimulatorWithoutCapabilities", "no capabilities")
	for _, sub := range []string{"snapshots", "public_IPs"} {
		if !strings.Contains(out, "--- FAIL: TestSimulatorWithoutCapabilities/"+sub+" ") {
			t.Errorf("subtest %s did not fail:\n%s", sub, out)
		}
	}
}

// broken is the simulator with one promise of the contract broken.
type broken struct {
	*sim.Sim
	find   func(ctx context.Context, scope region.Scope, tag, value string) ([]region.Server, error)
	get    func(ctx context.Context, id string) (region.Server, error)
	create func(ctx context.Context, spec region.ServerSpec) (region.Server, error)
	stop   func(ctx context.Context, id string) (region.Server, error)
	update func(ctx context.Context, id string, n region.ServerNetworking) (region.Server, error)
	del    func(ctx context.Context, id string) error
	key    func(ctx context.Context, id string) (region.SSHKey, error)
	cons   func(ctx context.Context, id string) (io.ReadWriteCloser, error)
	watch  func(ctx context.Context, after string, fn func(region.Event) error) error
}

func (b *broken) FindServers(ctx context.Context, scope region.Scope, tag, value string) ([]region.Server, error) {
	if b.find != nil {
		return b.find(ctx, scope, tag, value)
	}
	return b.Sim.FindServers(ctx, scope, tag, value)
}

func (b *broken) GetServer(ctx context.Context, id string) (region.Server, error) {
	if b.get != nil {
		return b.get(ctx, id)
	}
	return b.Sim.GetServer(ctx, id)
}

func (b *broken) CreateServer(ctx context.Context, spec region.ServerSpec) (region.Server, error) {
	if b.create != nil {
		return b.create(ctx, spec)
	}
	return b.Sim.CreateServer(ctx, spec)
}

func (b *broken) StopServer(ctx context.Context, id string) (region.Server, error) {
	if b.stop != nil {
		return b.stop(ctx, id)
	}
	return b.Sim.StopServer(ctx, id)
}

func (b *broken) UpdateNetworking(ctx context.Context, id string, n region.ServerNetworking) (region.Server, error) {
	if b.update != nil {
		return b.update(ctx, id, n)
	}
	return b.Sim.UpdateNetworking(ctx, id, n)
}

func (b *broken) DeleteServer(ctx context.Context, id string) error {
	if b.del != nil {
		return b.del(ctx, id)
	}
	return b.Sim.DeleteServer(ctx, id)
}

func (b *broken) SSHKey(ctx context.Context, id string) (region.SSHKey, error) {
	if b.key != nil {
		return b.key(ctx, id)
	}
	return b.Sim.SSHKey(ctx, id)
}

func (b *broken) OpenConsole(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	if b.cons != nil {
		return b.cons(ctx, id)
	}
	return b.Sim.OpenConsole(ctx, id)
}

// deafConsole takes what is typed and shows nothing of it.
type deafConsole struct{ *region.ConsoleBuffer }

func (deafConsole) Write(p []byte) (int, error) { return len(p), nil }

func (b *broken) Watch(ctx context.Context, after string, fn func(region.Event) error) error {
	if b.watch != nil {
		return b.watch(ctx, after, fn)
	}
	return b.Sim.Watch(ctx, after, fn)
}

// skipping is a watch of the simulator that does not pass on events of the kind.
func skipping(s *sim.Sim, kind region.EventKind) func(context.Context, string, func(region.Event) error) error {
	return func(ctx context.Context, after string, fn func(region.Event) error) error {
		return s.Watch(ctx, after, func(ev region.Event) error {
			if ev.Kind == kind {
				return nil
			}
			return fn(ev)
		})
	}
}

// listing finds servers by listing them all, matching as keep says.
func listing(s *sim.Sim, keep func(srv region.Server, scope region.Scope, tag, value string) bool) func(context.Context, region.Scope, string, string) ([]region.Server, error) {
	return func(ctx context.Context, scope region.Scope, tag, value string) ([]region.Server, error) {
		all, err := s.Servers(ctx)
		var out []region.Server
		for _, srv := range all {
			if keep(srv, scope, tag, value) {
				out = append(out, srv)
			}
		}
		return out, err
	}
}

// mutants each break one promise, and the subtest named must catch it ("" when the suite
// must fail before its subtests, as it does when its own watch cannot get going).
var mutants = []struct {
	name, failing string
	break_        func(s *sim.Sim, b *broken)
}{
	{"find ignores the value", "create,_find_and_settle", func(s *sim.Sim, b *broken) {
		b.find = listing(s, func(srv region.Server, scope region.Scope, tag, _ string) bool {
			_, ok := srv.Tags[tag]
			return ok && srv.Scope == scope
		})
	}},
	{"find ignores the scope", "create,_find_and_settle", func(s *sim.Sim, b *broken) {
		b.find = listing(s, func(srv region.Server, _ region.Scope, tag, value string) bool { return srv.Tags[tag] == value })
	}},
	{"create drops the public IP", "public_IPs", func(s *sim.Sim, b *broken) {
		b.create = func(ctx context.Context, spec region.ServerSpec) (region.Server, error) {
			spec.Networking.PublicIP = false
			return s.CreateServer(ctx, spec)
		}
	}},
	{"stop of a stopped server accepted", "stop_and_start", func(s *sim.Sim, b *broken) {
		b.stop = func(ctx context.Context, id string) (region.Server, error) {
			if srv, err := s.GetServer(ctx, id); err == nil && srv.State == region.ServerStopped {
				return srv, nil
			}
			return s.StopServer(ctx, id)
		}
	}},
	{"stop returns the state before", "stop_and_start", func(s *sim.Sim, b *broken) {
		b.stop = func(ctx context.Context, id string) (region.Server, error) {
			srv, err := s.StopServer(ctx, id)
			srv.State = region.ServerRunning
			return srv, err
		}
	}},
	{"update networking changes the MAC", "update_networking", func(s *sim.Sim, b *broken) {
		b.update = func(ctx context.Context, id string, n region.ServerNetworking) (region.Server, error) {
			srv, err := s.UpdateNetworking(ctx, id, n)
			srv.MAC = "fa:16:3e:00:00:00"
			return srv, err
		}
	}},
	{"ssh key handed out despite a CA", "ssh_key", func(s *sim.Sim, b *broken) {
		b.key = func(ctx context.Context, id string) (region.SSHKey, error) {
			key, err := s.SSHKey(ctx, id)
			if errors.Is(err, region.ErrRefused) {
				return region.SSHKey{PrivateKey: "-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n"}, nil
			}
			return key, err
		}
	}},
	{"unknown server unavailable", "unknown_server", func(s *sim.Sim, b *broken) {
		b.get = func(ctx context.Context, id string) (region.Server, error) {
			srv, err := s.GetServer(ctx, id)
			if errors.Is(err, region.ErrServerNotFound) {
				return srv, fmt.Errorf("get server: %w", region.ErrUnavailable)
			}
			return srv, err
		}
	}},
	{"deleting a gone server fails", "unknown_server", func(s *sim.Sim, b *broken) {
		b.del = func(ctx context.Context, id string) error {
			if _, err := s.GetServer(ctx, id); err != nil {
				return err
			}
			return s.DeleteServer(ctx, id)
		}
	}},
	{"console refused", "console", func(s *sim.Sim, b *broken) {
		b.cons = func(context.Context, string) (io.ReadWriteCloser, error) {
			return nil, fmt.Errorf("console: %w", region.ErrRefused)
		}
	}},
	{"console shows nothing typed", "console", func(s *sim.Sim, b *broken) {
		b.cons = func(ctx context.Context, id string) (io.ReadWriteCloser, error) {
			if _, err := s.OpenConsole(ctx, id); err != nil {
				return nil, err
			}
			return deafConsole{region.NewConsoleBuffer(1)}, nil
		}
	}},
	{"console opens on a stopped server", "stop_and_start", func(s *sim.Sim, b *broken) {
		b.cons = func(context.Context, string) (io.ReadWriteCloser, error) { return region.NewConsoleBuffer(1), nil }
	}},
	{"watch misses deletions", "delete", func(s *sim.Sim, b *broken) { b.watch = skipping(s, region.ServerDeleted) }},
	{"watch misses creations", "create,_find_and_settle", func(s *sim.Sim, b *broken) { b.watch = skipping(s, region.ServerCreated) }},
	{"watch misses updates", "", func(s *sim.Sim, b *broken) { b.watch = skipping(s, region.ServerUpdated) }},
	{"watch ignores its cursor", "watch_resumes_after_its_cursor", func(s *sim.Sim, b *broken) {
		b.watch = func(ctx context.Context, _ string, fn func(region.Event) error) error { return s.Watch(ctx, "", fn) }
	}},
	{"watch swallows the callback's error", "watch_ends_with_its_callback's_error", func(s *sim.Sim, b *broken) {
		b.watch = func(ctx context.Context, after string, fn func(region.Event) error) error {
			return s.Watch(ctx, after, func(ev region.Event) error { _ = fn(ev); return nil })
		}
	}},
	{"watch returns an error when cancelled", "", func(s *sim.Sim, b *broken) {
		b.watch = func(ctx context.Context, after string, fn func(region.Event) error) error {
			if err := s.Watch(ctx, after, fn); err != nil {
				return err
			}
			return ctx.Err()
		}
	}},
}

const mutantEnv = "REGIONTEST_MUTANT"

// TestContractCatchesBrokenDrivers runs the suite, in a process of its own, against each
// mutant: it must fail, in the subtest that covers the broken promise.
func TestContractCatchesBrokenDrivers(t *testing.T) {
	if name := os.Getenv(mutantEnv); name != "" {
		for _, m := range mutants {
			if m.name == name {
				regiontest.Run(t, harness(t, time.Second, func(s *sim.Sim) region.Client {
					b := &broken{Sim: s}
					m.break_(s, b)
					return b
				}))
				return
			}
		}
		t.Fatalf("no mutant %q", name)
	}
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			out := runChild(t, "TestContractCatchesBrokenDrivers", m.name)
			want := "--- FAIL: TestContractCatchesBrokenDrivers "
			if m.failing != "" {
				want = "--- FAIL: TestContractCatchesBrokenDrivers/" + m.failing + " "
			}
			if !strings.Contains(out, want) {
				t.Errorf("the suite did not fail as %q:\n%s", want, out)
			}
		})
	}
}

// runChild runs the test in a process of its own with the mutant named, which must fail, and
// returns its output.
func runChild(t *testing.T, test, mutant string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), mutantEnv+"="+mutant)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("the suite passed, or did not run (%v):\n%s", err, out)
	}
	return string(out)
}
