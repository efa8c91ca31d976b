package sim

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
)

var redisServer *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &redisServer) }

// waitLimit bounds every wait of the suite: far above what any step needs on a loaded
// machine, so a failure means the step did not happen rather than that it was slow.
const waitLimit = 5 * time.Second

// env is one test's world: a flushed Redis and the goroutines (clocks, watches) the test
// started. Cleanup order matters and is fixed by registration order: first the goroutines are
// cancelled, then the clients are closed (which unblocks a Watch sitting in XREAD, so it need not
// wait out its one-second block), and last the goroutines are waited for.
type env struct {
	tb  testing.TB
	rdb *redis.Client
	wg  sync.WaitGroup
}

func newEnv(tb testing.TB) *env {
	tb.Helper()
	e := &env{tb: tb}
	tb.Cleanup(e.wait) // registered first, so it runs last
	e.rdb = redisServer.Client(tb)
	return e
}

func (e *env) wait() {
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(waitLimit):
		e.tb.Errorf("clocks or watches did not stop within %s", waitLimit)
	}
}

// client returns another client of the same Redis, as another process of a deployment has.
func (e *env) client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: redisServer.Addr})
	e.tb.Cleanup(func() { c.Close() })
	return c
}

// sim returns a simulator on the test's client, with the demo catalogue and a fast tick unless
// opts say otherwise.
func (e *env) sim(opts Options) *Sim {
	return e.simOn(e.rdb, opts)
}

func (e *env) simOn(rdb redis.UniversalClient, opts Options) *Sim {
	e.tb.Helper()
	if opts.Catalog == nil {
		opts.Catalog = region.Demo()
	}
	if opts.Tick == 0 {
		opts.Tick = 2 * time.Millisecond
	}
	s, err := New(rdb, opts)
	if err != nil {
		e.tb.Fatalf("New: %v", err)
	}
	return s
}

// run drives the simulator's clock until the test ends; Run must then return nil.
func (e *env) run(s *Sim) {
	ctx, cancel := context.WithCancel(context.Background())
	e.tb.Cleanup(cancel)
	e.wg.Go(func() {
		if err := s.Run(ctx); err != nil {
			e.tb.Errorf("Run: %v", err)
		}
	})
}

// watch collects the events after the cursor until the test ends.
func (e *env) watch(s *Sim, after string) <-chan region.Event {
	ctx, cancel := context.WithCancel(context.Background())
	e.tb.Cleanup(cancel)
	ch := make(chan region.Event, 10_000)
	e.wg.Go(func() {
		err := s.Watch(ctx, after, func(ev region.Event) error {
			select {
			case ch <- ev:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			e.tb.Errorf("Watch: %v", err)
		}
	})
	return ch
}

// next returns the next event of the channel, failing the test if none comes.
func next(t *testing.T, ch <-chan region.Event) region.Event {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	case <-time.After(waitLimit):
		t.Fatalf("no event within %s", waitLimit)
		return region.Event{}
	}
}

// get reads a server straight from the simulator's state.
func (e *env) get(t *testing.T, s *Sim, id string) (region.Server, error) {
	t.Helper()
	return s.read(context.Background(), e.rdb, id)
}

// mustGet reads a server that must exist.
func (e *env) mustGet(t *testing.T, s *Sim, id string) region.Server {
	t.Helper()
	srv, err := e.get(t, s, id)
	if err != nil {
		t.Fatalf("read server %s: %v", id, err)
	}
	return srv
}

// eventCount is the length of the event stream: every event ever recorded.
func (e *env) eventCount(t *testing.T) int64 {
	t.Helper()
	n, err := e.rdb.XLen(context.Background(), eventsKey).Result()
	if err != nil {
		t.Fatalf("XLEN: %v", err)
	}
	return n
}

// waitState waits until the server is in the state.
func (e *env) waitState(t *testing.T, s *Sim, id string, want region.ServerState) region.Server {
	t.Helper()
	var srv region.Server
	eventually.Holds(t, waitLimit, func() bool {
		var err error
		srv, err = e.get(t, s, id)
		return err == nil && srv.State == want
	}, "server %s in state %s (last seen %s)", id, want, srv.State)
	return srv
}

// waitGone waits until the server no longer exists.
func (e *env) waitGone(t *testing.T, s *Sim, id string) {
	t.Helper()
	eventually.Holds(t, waitLimit, func() bool {
		_, err := e.get(t, s, id)
		return errors.Is(err, region.ErrServerNotFound)
	}, "server %s deleted", id)
}

// waitBlockedWatch waits until n clients sit in a blocking XREAD, which is when a Watch has
// pinned its starting point: the only outward sign of it.
func (e *env) waitBlockedWatch(t *testing.T, n int) {
	t.Helper()
	eventually.Holds(t, waitLimit, func() bool {
		info, err := e.rdb.Info(context.Background(), "clients").Result()
		if err != nil {
			return false
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "blocked_clients:"); ok {
				got, _ := strconv.Atoi(v)
				return got >= n
			}
		}
		return false
	}, "%d watches blocked in XREAD", n)
}

// fakeClock is an injectable Now that only moves when told to. It counts its readings, and
// since Run reads the time once per tick, at the start of applying due transitions, a test
// that waits for two more readings knows one full tick ran at the time it set.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	reads int
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *fakeClock) readCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads
}

// tick waits until the clock has applied everything due at the current fake time: the reading
// after the next one proves that the tick that took the next one has finished. Nothing else
// may read the clock meanwhile (tests only read state, which does not).
func (c *fakeClock) tick(t *testing.T) {
	t.Helper()
	start := c.readCount()
	eventually.Holds(t, waitLimit, func() bool { return c.readCount() >= start+2 }, "a full tick of the clock")
}

// scopeOf is the scope of a server on the demo network.
func scopeOf(t testing.TB, cat *region.Catalog, networkID string) region.Scope {
	t.Helper()
	n, ok := cat.Network(networkID)
	if !ok {
		t.Fatalf("no network %s", networkID)
	}
	return region.Scope{OrganizationID: n.OrganizationID, ProjectID: n.ProjectID, RegionID: n.Region, NetworkID: n.ID}
}

// spec is a server for the instance on the demo network.
func spec(t testing.TB, networkID, name, instanceID string) region.ServerSpec {
	t.Helper()
	return region.ServerSpec{
		Scope:    scopeOf(t, region.Demo(), networkID),
		Name:     name,
		FlavorID: "g1.small",
		ImageID:  "ubuntu-24.04",
		Networking: region.ServerNetworking{
			SecurityGroupIDs:       []string{"sg-acme-web-eu-ssh"},
			AllowedSourceAddresses: []string{"192.0.2.0/24"},
		},
		Tags: map[string]string{region.InstanceTag: instanceID, "team": "web"},
	}
}

// tinyCatalog has a /28 network with five usable addresses (the first ten of the prefix and
// its broadcast address are reserved) and a /16 one for benchmarks.
func tinyCatalog(tb testing.TB) *region.Catalog {
	tb.Helper()
	network := func(id, prefix string) map[string]any {
		return map[string]any{"id": id, "name": id, "organizationId": "o1", "projectId": "p1", "region": "r1", "prefix": prefix}
	}
	data, _ := json.Marshal(map[string]any{
		"regions":       []any{map[string]any{"id": "r1", "name": "R1"}},
		"organizations": []any{map[string]any{"id": "o1", "name": "O1", "projects": []any{map[string]any{"id": "p1", "name": "P1"}}}},
		"networks":      []any{network("tiny", "192.168.5.0/28"), network("big", "10.128.0.0/16")},
	})
	c, err := region.Parse(data)
	if err != nil {
		tb.Fatalf("parse catalogue: %v", err)
	}
	return c
}

// specOn is a server for the instance on a network of tinyCatalog.
func specOn(networkID, instanceID string) region.ServerSpec {
	return region.ServerSpec{
		Scope: region.Scope{OrganizationID: "o1", ProjectID: "p1", RegionID: "r1", NetworkID: networkID},
		Name:  "srv-" + instanceID, FlavorID: "f1", ImageID: "i1",
		Tags: map[string]string{region.InstanceTag: instanceID},
	}
}

// hostOffset is the position of the address in the prefix (0 is the network address).
func hostOffset(t *testing.T, p netip.Prefix, ip string) uint32 {
	t.Helper()
	a, err := netip.ParseAddr(ip)
	if err != nil || !p.Contains(a) {
		t.Fatalf("private IP %q is not in %s", ip, p)
	}
	return u32(a) - u32(p.Masked().Addr())
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// checkPrivateIP fails unless ip is a usable address of the prefix: not among its first ten
// addresses (network address and those clouds reserve) and not its broadcast address.
func checkPrivateIP(t *testing.T, p netip.Prefix, ip string) {
	t.Helper()
	off := hostOffset(t, p, ip)
	if off < 10 {
		t.Errorf("private IP %s is among the first ten addresses of %s", ip, p)
	}
	if off == 1<<(32-p.Bits())-1 {
		t.Errorf("private IP %s is the broadcast address of %s", ip, p)
	}
}

// cursorLess orders stream ids ("ms-seq").
func cursorLess(t *testing.T, a, b string) bool {
	t.Helper()
	parse := func(c string) (uint64, uint64) {
		ms, seq, ok := strings.Cut(c, "-")
		x, err1 := strconv.ParseUint(ms, 10, 64)
		y, err2 := strconv.ParseUint(seq, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("bad cursor %q", c)
		}
		return x, y
	}
	am, as := parse(a)
	bm, bs := parse(b)
	return am < bm || am == bm && as < bs
}
