package region_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
)

var redisServer *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &redisServer) }

// waitLimit bounds every wait: far above what a step needs, so a failure means it did not
// happen.
const waitLimit = 5 * time.Second

// fakeDriver is a region.Client that records the calls it gets and keeps an event log its
// Watch replays from a cursor (the log position) and then follows, as a durable driver does.
type fakeDriver struct {
	name string

	mu      sync.Mutex
	calls   []string // "Verb inner-id" (or "Verb region" for calls naming no server)
	servers map[string]region.Server
	images  []region.Image
	// imagesErr fails Images.
	imagesErr error
	log       []region.Event // log[i] has cursor i+1
	grew      chan struct{}  // closed and replaced when the log grows
	n         int

	// started receives each Watch's starting cursor once the watch has pinned where it
	// starts, so a test knows when events it emits will be seen.
	started chan string
	// fail ends the running Watch with the error sent.
	fail chan error
	// returned receives what each Watch returned.
	returned chan error
}

func newFake(name string) *fakeDriver {
	return &fakeDriver{
		name: name, servers: map[string]region.Server{}, grew: make(chan struct{}),
		started: make(chan string, 16), fail: make(chan error, 1), returned: make(chan error, 16),
	}
}

var _ region.Client = (*fakeDriver)(nil)

func (f *fakeDriver) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

func (f *fakeDriver) takeCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fakeDriver) server(op, id string) (region.Server, error) {
	f.record(op + " " + id)
	f.mu.Lock()
	defer f.mu.Unlock()
	srv, ok := f.servers[id]
	if !ok {
		return region.Server{}, fmt.Errorf("%s %s: %w", op, id, region.ErrServerNotFound)
	}
	return srv, nil
}

func (f *fakeDriver) FindServers(_ context.Context, scope region.Scope, tag, value string) ([]region.Server, error) {
	f.record("FindServers " + scope.RegionID)
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []region.Server
	for _, s := range f.servers {
		if s.Scope == scope && s.Tags[tag] == value {
			out = append(out, s)
		}
	}
	return out, nil
}

func (f *fakeDriver) CreateServer(_ context.Context, spec region.ServerSpec) (region.Server, error) {
	f.record("CreateServer " + spec.RegionID)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	srv := region.Server{ID: fmt.Sprintf("%s-%d", f.name, f.n), ServerSpec: spec, State: region.ServerPending}
	f.servers[srv.ID] = srv
	return srv, nil
}

func (f *fakeDriver) UpdateNetworking(_ context.Context, id string, _ region.ServerNetworking) (region.Server, error) {
	return f.server("UpdateNetworking", id)
}
func (f *fakeDriver) GetServer(_ context.Context, id string) (region.Server, error) {
	return f.server("GetServer", id)
}
func (f *fakeDriver) DeleteServer(_ context.Context, id string) error {
	f.record("DeleteServer " + id)
	return nil
}
func (f *fakeDriver) StartServer(_ context.Context, id string) (region.Server, error) {
	return f.server("StartServer", id)
}
func (f *fakeDriver) StopServer(_ context.Context, id string) (region.Server, error) {
	return f.server("StopServer", id)
}
func (f *fakeDriver) RebootServer(_ context.Context, id string, hard bool) (region.Server, error) {
	return f.server("RebootServer", id)
}
func (f *fakeDriver) ResizeServer(_ context.Context, id, _ string) (region.Server, error) {
	return f.server("ResizeServer", id)
}
func (f *fakeDriver) ConsoleOutput(_ context.Context, id string, _ int) (region.ConsoleOutput, error) {
	if _, err := f.server("ConsoleOutput", id); err != nil {
		return region.ConsoleOutput{}, err
	}
	return region.ConsoleOutput{Text: f.name + " console"}, nil
}
func (f *fakeDriver) OpenConsole(_ context.Context, id string) (io.ReadWriteCloser, error) {
	if _, err := f.server("OpenConsole", id); err != nil {
		return nil, err
	}
	return region.NewConsoleBuffer(1), nil
}
func (f *fakeDriver) SSHKey(_ context.Context, id string) (region.SSHKey, error) {
	if _, err := f.server("SSHKey", id); err != nil {
		return region.SSHKey{}, err
	}
	return region.SSHKey{PrivateKey: f.name + " key"}, nil
}
func (f *fakeDriver) Snapshot(_ context.Context, id string, req region.ImageRequest) (region.Image, error) {
	if _, err := f.server("Snapshot", id); err != nil {
		return region.Image{}, err
	}
	return region.Image{ID: f.name + "-img", Name: req.Name}, nil
}
func (f *fakeDriver) DeleteImage(_ context.Context, org, project, id string) error {
	f.record("DeleteImage " + org + "/" + project + " " + id)
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.images, func(im region.Image) bool { return im.ID == id })
	if i < 0 {
		return region.ErrImageNotFound
	}
	f.images = slices.Delete(f.images, i, i+1)
	return nil
}
func (f *fakeDriver) Images(_ context.Context, org, project string) ([]region.Image, error) {
	f.record("Images " + org + "/" + project)
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.images), f.imagesErr
}

// emit appends an event of the server (an inner id) in the region to the log.
func (f *fakeDriver) emit(kind region.EventKind, regionID, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, region.Event{
		Cursor: strconv.Itoa(len(f.log) + 1), Kind: kind, ServerID: id,
		Scope: region.Scope{OrganizationID: "o", ProjectID: "p", RegionID: regionID, NetworkID: "n"},
		Tags:  map[string]string{region.InstanceTag: id},
	})
	close(f.grew)
	f.grew = make(chan struct{})
}

// Watch replays the log after the cursor ("" for from now on) and follows it.
func (f *fakeDriver) Watch(ctx context.Context, after string, fn func(region.Event) error) (err error) {
	defer func() { f.returned <- err }()
	f.mu.Lock()
	pos := len(f.log)
	if after != "" {
		n, err := strconv.Atoi(after)
		if err != nil || n < 0 || n > len(f.log) {
			f.mu.Unlock()
			return fmt.Errorf("fake %s: bad cursor %q", f.name, after)
		}
		pos = n
	}
	f.mu.Unlock()
	f.started <- after
	for {
		f.mu.Lock()
		evs, grew := f.log[pos:], f.grew
		f.mu.Unlock()
		for _, ev := range evs {
			if err := fn(ev); err != nil {
				return err
			}
			pos++
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-f.fail:
			return err
		case <-grew:
		}
	}
}

// started waits until the driver's next Watch is under way and returns its cursor.
func started(t *testing.T, f *fakeDriver) string {
	t.Helper()
	select {
	case c := <-f.started:
		return c
	case <-time.After(waitLimit):
		t.Fatalf("fake %s: no watch started within %s", f.name, waitLimit)
		return ""
	}
}

// fakes is a router over fake a serving r1 and fake b serving r2 and r3.
func fakes(t *testing.T) (*region.Router, *fakeDriver, *fakeDriver) {
	t.Helper()
	a, b := newFake("a"), newFake("b")
	r, err := region.NewRouter([]region.Route{
		{Region: "r1", Driver: "a", Client: a},
		{Region: "r2", Driver: "b", Client: b},
		{Region: "r3", Driver: "b", Client: b},
	})
	if err != nil {
		t.Fatalf("NewRouter: %v", err)
	}
	return r, a, b
}

func specIn(regionID, instance string) region.ServerSpec {
	return region.ServerSpec{
		Scope: region.Scope{OrganizationID: "o", ProjectID: "p", RegionID: regionID, NetworkID: "n"},
		Name:  "srv-" + instance, FlavorID: "f", ImageID: "i",
		Tags: map[string]string{region.InstanceTag: instance},
	}
}

func TestNewRouterRefuses(t *testing.T) {
	a, b := newFake("a"), newFake("b")
	for _, tc := range []struct {
		name   string
		routes []region.Route
		want   string // the error's text, or its start
	}{
		{"region routed twice", []region.Route{{Region: "r1", Driver: "a", Client: a}, {Region: "r1", Driver: "b", Client: b}},
			`region router: region "r1" routed twice`},
		{"same region, same driver", []region.Route{{Region: "r1", Driver: "a", Client: a}, {Region: "r1", Driver: "a", Client: a}},
			`region router: region "r1" routed twice`},
		{"region with a slash", []region.Route{{Region: "eu/west", Driver: "a", Client: a}}, "region router: bad route"},
		{"empty region", []region.Route{{Region: "", Driver: "a", Client: a}}, "region router: bad route"},
		{"no client", []region.Route{{Region: "r1", Driver: "a"}}, "region router: bad route"},
		{"driver name naming two clients", []region.Route{{Region: "r1", Driver: "d", Client: a}, {Region: "r2", Driver: "d", Client: b}},
			`region router: driver name "d" names two drivers`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := region.NewRouter(tc.routes)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("NewRouter: got %v, want an error starting %q", err, tc.want)
			}
			if r != nil {
				t.Errorf("NewRouter returned a router along with its error")
			}
		})
	}
	t.Run("accepts one driver serving two regions", func(t *testing.T) {
		if _, err := region.NewRouter([]region.Route{{Region: "r1", Driver: "a", Client: a}, {Region: "r2", Driver: "a", Client: a}}); err != nil {
			t.Fatalf("NewRouter: %v", err)
		}
	})
}

// TestRouterRoutesServers: each call reaches the driver of the server's region with the id the
// driver gave, and the servers it returns come back with qualified ids.
func TestRouterRoutesServers(t *testing.T) {
	r, a, b := fakes(t)
	ctx := context.Background()
	made := map[string]region.Server{}
	for _, tc := range []struct {
		region, wantID string
		driver         *fakeDriver
	}{
		{"r1", "r1/a-1", a},
		{"r3", "r3/b-1", b},
		{"r2", "r2/b-2", b},
	} {
		srv, err := r.CreateServer(ctx, specIn(tc.region, tc.wantID))
		if err != nil {
			t.Fatalf("CreateServer in %s: %v", tc.region, err)
		}
		if srv.ID != tc.wantID || srv.RegionID != tc.region {
			t.Errorf("CreateServer in %s returned id %q region %q, want %q", tc.region, srv.ID, srv.RegionID, tc.wantID)
		}
		made[tc.wantID] = srv
	}
	if got, want := a.takeCalls(), []string{"CreateServer r1"}; !slices.Equal(got, want) {
		t.Errorf("driver a got %v, want %v", got, want)
	}
	if got, want := b.takeCalls(), []string{"CreateServer r3", "CreateServer r2"}; !slices.Equal(got, want) {
		t.Errorf("driver b got %v, want %v", got, want)
	}

	verbs := []struct {
		verb string
		call func(id string) (string, error) // returns the id of what came back, if a server
	}{
		{"GetServer", func(id string) (string, error) { s, err := r.GetServer(ctx, id); return s.ID, err }},
		{"StartServer", func(id string) (string, error) { s, err := r.StartServer(ctx, id); return s.ID, err }},
		{"StopServer", func(id string) (string, error) { s, err := r.StopServer(ctx, id); return s.ID, err }},
		{"RebootServer", func(id string) (string, error) { s, err := r.RebootServer(ctx, id, true); return s.ID, err }},
		{"UpdateNetworking", func(id string) (string, error) {
			s, err := r.UpdateNetworking(ctx, id, region.ServerNetworking{})
			return s.ID, err
		}},
		{"DeleteServer", func(id string) (string, error) { return id, r.DeleteServer(ctx, id) }},
		{"ResizeServer", func(id string) (string, error) { s, err := r.ResizeServer(ctx, id, "f"); return s.ID, err }},
		{"ConsoleOutput", func(id string) (string, error) { _, err := r.ConsoleOutput(ctx, id, 10); return id, err }},
		{"OpenConsole", func(id string) (string, error) { _, err := r.OpenConsole(ctx, id); return id, err }},
		{"SSHKey", func(id string) (string, error) { _, err := r.SSHKey(ctx, id); return id, err }},
		{"Snapshot", func(id string) (string, error) {
			_, err := r.Snapshot(ctx, id, region.ImageRequest{Name: "x"})
			return id, err
		}},
	}
	for _, v := range verbs {
		for _, tc := range []struct {
			id, inner string
			to, other *fakeDriver
		}{
			{"r1/a-1", "a-1", a, b},
			{"r3/b-1", "b-1", b, a},
			{"r2/b-2", "b-2", b, a},
		} {
			t.Run(v.verb+" "+tc.id, func(t *testing.T) {
				got, err := v.call(tc.id)
				if err != nil {
					t.Fatalf("%s: %v", v.verb, err)
				}
				if got != tc.id {
					t.Errorf("%s returned server %q, want %q", v.verb, got, tc.id)
				}
				if calls := tc.to.takeCalls(); !slices.Equal(calls, []string{v.verb + " " + tc.inner}) {
					t.Errorf("driver %s got %v, want just %s %s", tc.to.name, calls, v.verb, tc.inner)
				}
				if calls := tc.other.takeCalls(); len(calls) != 0 {
					t.Errorf("driver %s got %v, want nothing", tc.other.name, calls)
				}
			})
		}
	}

	t.Run("FindServers", func(t *testing.T) {
		want := made["r3/b-1"]
		got, err := r.FindServers(ctx, want.Scope, region.InstanceTag, "r3/b-1")
		if err != nil {
			t.Fatalf("FindServers: %v", err)
		}
		if len(got) != 1 || got[0].ID != "r3/b-1" {
			t.Errorf("FindServers found %v, want r3/b-1", got)
		}
		if calls := b.takeCalls(); !slices.Equal(calls, []string{"FindServers r3"}) {
			t.Errorf("driver b got %v", calls)
		}
		if calls := a.takeCalls(); len(calls) != 0 {
			t.Errorf("driver a got %v, want nothing", calls)
		}
	})
}

// TestRouterUnknownRegionsAndIDs: an id that names no routed region, or is not qualified, is a
// server that cannot exist; a call naming a region no driver serves is ErrUnknownRegion. No
// driver is asked.
func TestRouterUnknownRegionsAndIDs(t *testing.T) {
	r, a, b := fakes(t)
	ctx := context.Background()
	if _, err := r.CreateServer(ctx, specIn("r1", "x")); err != nil { // a-1 exists in r1
		t.Fatal(err)
	}
	a.takeCalls()
	for _, id := range []string{"mars/a-1", "a-1", "r1/", "", "/a-1", "r2/a-1"} {
		t.Run(fmt.Sprintf("id %q", id), func(t *testing.T) {
			for verb, call := range map[string]func() error{
				"GetServer":    func() error { _, err := r.GetServer(ctx, id); return err },
				"StartServer":  func() error { _, err := r.StartServer(ctx, id); return err },
				"StopServer":   func() error { _, err := r.StopServer(ctx, id); return err },
				"RebootServer": func() error { _, err := r.RebootServer(ctx, id, false); return err },
				"UpdateNetworking": func() error {
					_, err := r.UpdateNetworking(ctx, id, region.ServerNetworking{})
					return err
				},
				"ResizeServer":  func() error { _, err := r.ResizeServer(ctx, id, "f"); return err },
				"ConsoleOutput": func() error { _, err := r.ConsoleOutput(ctx, id, 10); return err },
				"OpenConsole":   func() error { _, err := r.OpenConsole(ctx, id); return err },
				"SSHKey":        func() error { _, err := r.SSHKey(ctx, id); return err },
				"Snapshot":      func() error { _, err := r.Snapshot(ctx, id, region.ImageRequest{}); return err },
			} {
				if err := call(); !errors.Is(err, region.ErrServerNotFound) {
					t.Errorf("%s: got %v, want ErrServerNotFound", verb, err)
				}
			}
		})
	}
	// r2/a-1 reached driver b, which does not have it; nothing else reached a driver.
	if calls := a.takeCalls(); len(calls) != 0 {
		t.Errorf("driver a got %v, want nothing", calls)
	}
	for _, c := range b.takeCalls() {
		if !strings.HasSuffix(c, " a-1") {
			t.Errorf("driver b got %q, want only calls of r2/a-1", c)
		}
	}

	if _, err := r.CreateServer(ctx, specIn("mars", "y")); !errors.Is(err, region.ErrUnknownRegion) {
		t.Errorf("CreateServer in an unrouted region: got %v, want ErrUnknownRegion", err)
	}
	if _, err := r.FindServers(ctx, specIn("mars", "y").Scope, region.InstanceTag, "y"); !errors.Is(err, region.ErrUnknownRegion) {
		t.Errorf("FindServers in an unrouted region: got %v, want ErrUnknownRegion", err)
	}
	if calls := slices.Concat(a.takeCalls(), b.takeCalls()); len(calls) != 0 {
		t.Errorf("the drivers got %v, want nothing", calls)
	}
}

// TestRouterDeleteImage: the driver that has the image deletes it; one no driver has is
// ErrImageNotFound.
func TestRouterDeleteImage(t *testing.T) {
	r, a, b := fakes(t)
	a.images = []region.Image{{ID: "a-img"}}
	b.images = []region.Image{{ID: "b-img"}}
	if err := r.DeleteImage(context.Background(), "o", "p", "b-img"); err != nil {
		t.Fatalf("DeleteImage b-img: %v", err)
	}
	if len(b.images) != 0 || len(a.images) != 1 {
		t.Errorf("after DeleteImage b-img: a has %v, b has %v; want a-img kept and b-img gone", a.images, b.images)
	}
	if err := r.DeleteImage(context.Background(), "o", "p", "b-img"); !errors.Is(err, region.ErrImageNotFound) {
		t.Errorf("DeleteImage of a deleted image: %v, want ErrImageNotFound", err)
	}
}

// TestRouterImages: the images of every driver, each driver asked once however many regions it
// serves; a driver's failure fails the call.
func TestRouterImages(t *testing.T) {
	r, a, b := fakes(t)
	a.images = []region.Image{{ID: "a-img"}}
	b.images = []region.Image{{ID: "b-img-1"}, {ID: "b-img-2"}}
	images, err := r.Images(context.Background(), "o", "p")
	if err != nil {
		t.Fatalf("Images: %v", err)
	}
	var got []string
	for _, im := range images {
		got = append(got, im.ID)
	}
	slices.Sort(got)
	if want := []string{"a-img", "b-img-1", "b-img-2"}; !slices.Equal(got, want) {
		t.Errorf("Images = %v, want %v", got, want)
	}
	for _, f := range []*fakeDriver{a, b} {
		if calls := f.takeCalls(); !slices.Equal(calls, []string{"Images o/p"}) {
			t.Errorf("driver %s got %v, want one Images o/p", f.name, calls)
		}
	}

	errBroken := errors.New("driver b is broken")
	b.mu.Lock()
	b.imagesErr = errBroken
	b.mu.Unlock()
	if _, err := r.Images(context.Background(), "o", "p"); !errors.Is(err, errBroken) {
		t.Errorf("Images with a failing driver: got %v, want its error", err)
	}
}

// routerWatch is a router's watch running until stop, its events on a channel.
type routerWatch struct {
	events chan region.Event
	cancel context.CancelFunc
	ended  chan error
}

func watchRouter(t *testing.T, r *region.Router, after string, fn func(region.Event) error) *routerWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &routerWatch{events: make(chan region.Event, 1000), cancel: cancel, ended: make(chan error, 1)}
	go func() {
		w.ended <- r.Watch(ctx, after, func(ev region.Event) error {
			if fn != nil {
				if err := fn(ev); err != nil {
					return err
				}
			}
			w.events <- ev
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.ended:
		case <-time.After(waitLimit):
			t.Errorf("router watch did not end within %s", waitLimit)
		}
	})
	return w
}

// stop cancels the watch and returns what Watch returned.
func (w *routerWatch) stop(t *testing.T) error {
	t.Helper()
	w.cancel()
	return w.end(t)
}

func (w *routerWatch) end(t *testing.T) error {
	t.Helper()
	select {
	case err := <-w.ended:
		w.ended <- err // for the cleanup
		return err
	case <-time.After(waitLimit):
		t.Fatalf("router watch did not end within %s", waitLimit)
		return nil
	}
}

// next returns the next n events.
func (w *routerWatch) next(t *testing.T, n int) []region.Event {
	t.Helper()
	var out []region.Event
	for range n {
		select {
		case ev := <-w.events:
			out = append(out, ev)
		case <-time.After(waitLimit):
			t.Fatalf("got %d events within %s, want %d: %v", len(out), waitLimit, n, out)
		}
	}
	return out
}

// byID lists the events' server ids, in the order each driver reported them: per driver the
// order is kept, across drivers it is not defined.
func serverIDs(evs []region.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.ServerID)
	}
	return out
}

// perDriver splits qualified ids by the fake that serves their region (r1: a, else b).
func perDriver(ids []string) (a, b []string) {
	for _, id := range ids {
		if strings.HasPrefix(id, "r1/") {
			a = append(a, id)
		} else {
			b = append(b, id)
		}
	}
	return a, b
}

func TestRouterWatch(t *testing.T) {
	t.Run("qualified events of every driver, resumed where each was", func(t *testing.T) {
		r, a, b := fakes(t)
		w := watchRouter(t, r, "", nil)
		if ca, cb := started(t, a), started(t, b); ca != "" || cb != "" {
			t.Fatalf("a watch from now started the drivers at %q and %q, want \"\"", ca, cb)
		}
		a.emit(region.ServerCreated, "r1", "a-1")
		b.emit(region.ServerCreated, "r2", "b-1")
		b.emit(region.ServerUpdated, "r3", "b-2")
		a.emit(region.ServerDeleted, "r1", "a-1")
		first := w.next(t, 4)
		gotA, gotB := perDriver(serverIDs(first))
		if !slices.Equal(gotA, []string{"r1/a-1", "r1/a-1"}) || !slices.Equal(gotB, []string{"r2/b-1", "r3/b-2"}) {
			t.Fatalf("events of a %v and of b %v, want [r1/a-1 r1/a-1] and [r2/b-1 r3/b-2]", gotA, gotB)
		}
		for _, ev := range first {
			if ev.Cursor == "" || ev.Tags[region.InstanceTag] != strings.SplitN(ev.ServerID, "/", 2)[1] {
				t.Errorf("event %+v: want a cursor and the driver's tags", ev)
			}
		}
		if err := w.stop(t); err != nil {
			t.Fatalf("Watch after its context was cancelled: %v, want nil", err)
		}
		cursor := first[len(first)-1].Cursor

		// While nobody watches, both drivers go on.
		a.emit(region.ServerUpdated, "r1", "a-2")
		b.emit(region.ServerDeleted, "r2", "b-1")
		b.emit(region.ServerUpdated, "r3", "b-3")

		w = watchRouter(t, r, cursor, nil)
		if ca, cb := started(t, a), started(t, b); ca != "2" || cb != "2" {
			t.Fatalf("resumed at %q, the drivers started at %q and %q, want 2 and 2 (each after its last event)", cursor, ca, cb)
		}
		a.emit(region.ServerUpdated, "r1", "a-3") // and a live one
		resumed := w.next(t, 4)
		gotA, gotB = perDriver(serverIDs(resumed))
		if !slices.Equal(gotA, []string{"r1/a-2", "r1/a-3"}) || !slices.Equal(gotB, []string{"r2/b-1", "r3/b-3"}) {
			t.Errorf("resumed: events of a %v and of b %v, want [r1/a-2 r1/a-3] and [r2/b-1 r3/b-3]", gotA, gotB)
		}
		// Nothing more: a marker emitted now is the very next event.
		b.emit(region.ServerUpdated, "r2", "marker")
		if ev := w.next(t, 1)[0]; ev.ServerID != "r2/marker" {
			t.Errorf("after the resumed events came %q, want the marker", ev.ServerID)
		}
	})

	t.Run("a failing driver ends it with its error", func(t *testing.T) {
		r, a, b := fakes(t)
		w := watchRouter(t, r, "", nil)
		started(t, a)
		started(t, b)
		errLost := errors.New("lost the host")
		b.fail <- errLost
		if err := w.end(t); !errors.Is(err, errLost) {
			t.Errorf("Watch: got %v, want the driver's error", err)
		}
		// The other driver's watch was ended too: nothing is left running.
		for _, f := range []*fakeDriver{a, b} {
			select {
			case <-f.returned:
			case <-time.After(waitLimit):
				t.Errorf("driver %s's watch did not end", f.name)
			}
		}
	})

	t.Run("a driver refusing the cursor ends it with its error", func(t *testing.T) {
		r, _, _ := fakes(t)
		w := watchRouter(t, r, "a=7&b=0", nil)
		if err := w.end(t); err == nil || !strings.Contains(err.Error(), `fake a: bad cursor "7"`) {
			t.Errorf("Watch: got %v, want driver a's refusal of cursor 7", err)
		}
	})

	t.Run("a malformed cursor is refused", func(t *testing.T) {
		r, _, _ := fakes(t)
		if err := r.Watch(context.Background(), "a=%zz", func(region.Event) error { return nil }); err == nil {
			t.Errorf("Watch with a malformed cursor returned nil")
		}
	})

	t.Run("the callback's error ends it", func(t *testing.T) {
		r, a, b := fakes(t)
		errEnough := errors.New("enough")
		w := watchRouter(t, r, "", func(region.Event) error { return errEnough })
		started(t, a)
		started(t, b)
		a.emit(region.ServerCreated, "r1", "a-1")
		if err := w.end(t); !errors.Is(err, errEnough) {
			t.Errorf("Watch: got %v, want the callback's error", err)
		}
	})
}

// TestRouterOverTwoSimulators: two real simulated regions (each in its own Redis database)
// behind one router.
func TestRouterOverTwoSimulators(t *testing.T) {
	ctx := context.Background()
	cat := region.Demo()
	eu := redisServer.Client(t) // flushes every database
	us := redis.NewClient(&redis.Options{Addr: redisServer.Addr, DB: 1})
	t.Cleanup(func() { us.Close() })

	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // registered first: runs after the clocks are told to stop
	runCtx, stopClocks := context.WithCancel(ctx)
	t.Cleanup(stopClocks)
	sims := map[string]*sim.Sim{}
	for regionID, rdb := range map[string]*redis.Client{"eu-west": eu, "us-east": us} {
		s, err := sim.New(rdb, sim.Options{Catalog: cat, Tick: 2 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		sims[regionID] = s
		wg.Go(func() {
			if err := s.Run(runCtx); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	r, err := region.NewRouter([]region.Route{
		{Region: "eu-west", Driver: "sim-eu", Client: sims["eu-west"]},
		{Region: "us-east", Driver: "sim-us", Client: sims["us-east"]},
	})
	if err != nil {
		t.Fatal(err)
	}

	w := watchRouter(t, r, "", nil)
	waitBlockedWatches(t, eu, 2) // both simulators' watches have pinned where they start

	spec := func(networkID, instance string) region.ServerSpec {
		n, _ := cat.Network(networkID)
		return region.ServerSpec{
			Scope: region.Scope{OrganizationID: n.OrganizationID, ProjectID: n.ProjectID, RegionID: n.Region, NetworkID: n.ID},
			Name:  instance, FlavorID: "g1.small", ImageID: "ubuntu-24.04",
			Tags: map[string]string{region.InstanceTag: instance},
		}
	}
	made := map[string]region.Server{}
	for _, tc := range []struct{ network, instance, region string }{
		{"net-acme-web-eu", "i-eu", "eu-west"},
		{"net-acme-web-us", "i-us", "us-east"},
	} {
		srv, err := r.CreateServer(ctx, spec(tc.network, tc.instance))
		if err != nil {
			t.Fatalf("CreateServer: %v", err)
		}
		inner, ok := strings.CutPrefix(srv.ID, tc.region+"/")
		if !ok {
			t.Fatalf("server id %q is not qualified by region %s", srv.ID, tc.region)
		}
		// It lives in its region's simulator, and only there.
		for regionID, s := range sims {
			_, err := s.GetServer(ctx, inner)
			if regionID == tc.region && err != nil {
				t.Errorf("simulator of %s does not have %s: %v", regionID, inner, err)
			}
			if regionID != tc.region && !errors.Is(err, region.ErrServerNotFound) {
				t.Errorf("simulator of %s has %s of %s (%v)", regionID, inner, tc.region, err)
			}
		}
		made[tc.instance] = srv
	}

	// Created, building, running: three events of each, qualified.
	first := w.next(t, 6)
	for _, inst := range []string{"i-eu", "i-us"} {
		var kinds []region.EventKind
		for _, ev := range first {
			if ev.ServerID == made[inst].ID {
				kinds = append(kinds, ev.Kind)
			}
		}
		if want := []region.EventKind{region.ServerCreated, region.ServerUpdated, region.ServerUpdated}; !slices.Equal(kinds, want) {
			t.Errorf("events of %s: %v, want %v (all events: %v)", made[inst].ID, kinds, want, serverIDs(first))
		}
	}
	for inst, srv := range made {
		got, err := r.GetServer(ctx, srv.ID)
		if err != nil || got.State != region.ServerRunning || got.ID != srv.ID {
			t.Errorf("GetServer %s: %s %s (%v), want it RUNNING", srv.ID, got.ID, got.State, err)
		}
		found, err := r.FindServers(ctx, srv.Scope, region.InstanceTag, inst)
		if err != nil || len(found) != 1 || found[0].ID != srv.ID {
			t.Errorf("FindServers %s: %v (%v)", inst, found, err)
		}
	}
	// The other region's id with this one's server: no such server.
	euInner := strings.TrimPrefix(made["i-eu"].ID, "eu-west/")
	if _, err := r.GetServer(ctx, "us-east/"+euInner); !errors.Is(err, region.ErrServerNotFound) {
		t.Errorf("GetServer of an EU server under us-east: got %v, want ErrServerNotFound", err)
	}

	// Snapshots of both: the router lists both, each simulator its own.
	var want []string
	for _, srv := range made {
		img, err := r.Snapshot(ctx, srv.ID, region.ImageRequest{Name: "snap-" + srv.Name})
		if err != nil {
			t.Fatalf("Snapshot: %v", err)
		}
		want = append(want, img.ID)
	}
	slices.Sort(want)
	images, err := r.Images(ctx, "acme", "web")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, im := range images {
		got = append(got, im.ID)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("Images = %v, want %v", got, want)
	}

	// Stopped, then both deleted while nobody watches: the resumed watch reports exactly the
	// deletions, nothing before them again.
	cursor := first[len(first)-1].Cursor
	if err := w.stop(t); err != nil {
		t.Fatalf("Watch after its context was cancelled: %v, want nil", err)
	}
	for _, srv := range made {
		if err := r.DeleteServer(ctx, srv.ID); err != nil {
			t.Fatalf("DeleteServer: %v", err)
		}
	}
	w = watchRouter(t, r, cursor, nil)
	resumed := w.next(t, 4)
	for _, srv := range made {
		var kinds []region.EventKind
		for _, ev := range resumed {
			if ev.ServerID == srv.ID {
				kinds = append(kinds, ev.Kind)
			}
		}
		if want := []region.EventKind{region.ServerUpdated, region.ServerDeleted}; !slices.Equal(kinds, want) {
			t.Errorf("resumed events of %s: %v, want %v (all: %v)", srv.ID, kinds, want, serverIDs(resumed))
		}
	}
	for _, srv := range made {
		if _, err := r.GetServer(ctx, srv.ID); !errors.Is(err, region.ErrServerNotFound) {
			t.Errorf("GetServer %s after its deleted event: %v, want ErrServerNotFound", srv.ID, err)
		}
	}
}

// waitBlockedWatches waits until n clients of the Redis server sit in a blocking XREAD: the
// only outward sign that a simulator's watch has pinned where it starts.
func waitBlockedWatches(t *testing.T, rdb *redis.Client, n int) {
	t.Helper()
	eventually.Holds(t, waitLimit, func() bool {
		info, err := rdb.Info(context.Background(), "clients").Result()
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
