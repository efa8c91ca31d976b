package libvirt

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/region"
)

// Driver is a libvirt region: one host, or several. Each host has a connection of its own
// (a hostDriver); the region places new servers, routes every call about a server to the host
// that holds it, and merges the hosts' events into one watch. Its methods are safe for
// concurrent use; Run keeps the connections, and a host not connected yet answers
// ErrUnreachable.
//
// A host that cannot be reached is never taken to hold nothing: FindServers of an instance that
// may have a server there (its set of instances in Redis says so, or this process last saw
// one) is ErrUnreachable, so the instance shows the condition and no second server is made
// elsewhere. An operator who knows a host is gone for good takes it out of the region's hosts;
// its instances are then made again on the others (see the README).
type Driver struct {
	opts    Options
	hosts   []*hostDriver
	watches *broadcaster
	// placing serialises this process's choices of host.
	placing sync.Mutex
}

var (
	_ region.Client = (*Driver)(nil)
	_ region.Lister = (*Driver)(nil)
)

// New returns a driver of the region; it connects to the hosts when Run starts.
func New(opts Options) (*Driver, error) {
	r := opts.Region
	if r.Driver != region.DriverLibvirt || r.Libvirt == nil {
		return nil, fmt.Errorf("libvirt: region %q is not a libvirt region", r.ID)
	}
	if opts.Catalog == nil || opts.Redis == nil {
		return nil, errors.New("libvirt: Catalog and Redis are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Retry <= 0 {
		opts.Retry = 2 * time.Second
	}
	if opts.Tick <= 0 {
		opts.Tick = time.Second
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = time.Minute
	}
	if opts.StuckTimeout <= 0 {
		opts.StuckTimeout = 2 * time.Minute
	}
	d := &Driver{opts: opts, watches: newBroadcaster()}
	named := len(r.Libvirt.Hosts) > 0
	for i, cfg := range r.Libvirt.HostList() {
		keyHost := ""
		if named {
			keyHost = cfg.Name
		}
		h, err := newHost(opts, cfg, keyHost, d.watches)
		if err != nil {
			return nil, err
		}
		h.first = i == 0
		d.hosts = append(d.hosts, h)
	}
	if len(d.hosts) > 1 {
		for _, h := range d.hosts {
			h.instancesKey = hostInstancesKey(r.ID, h.cfg.Name)
			h.elsewhere = d.addressesElsewhere(h)
		}
	}
	return d, nil
}

// Run keeps every host connected until ctx ends.
func (d *Driver) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, h := range d.hosts {
		wg.Go(func() { _ = h.Run(ctx) })
	}
	wg.Wait()
	return nil
}

// Connected reports whether the driver is connected to every host of the region.
func (d *Driver) Connected() bool {
	for _, h := range d.hosts {
		if !h.Connected() {
			return false
		}
	}
	return true
}

// Register adds the gauge computeql_libvirt_host_connected{region, host} to reg: 1 while this
// process is connected to the host, 0 while it cannot reach it. Hosts come from the catalogue,
// so the series are bounded by it.
func (d *Driver) Register(reg prometheus.Registerer) error {
	for _, h := range d.hosts {
		gauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "computeql_libvirt_host_connected",
			Help:        "Whether this process is connected to the libvirt host (1) or cannot reach it (0).",
			ConstLabels: prometheus.Labels{"region": d.opts.Region.ID, "host": h.cfg.Name},
		}, func() float64 {
			if h.Connected() {
				return 1
			}
			return 0
		})
		if err := reg.Register(gauge); err != nil {
			return fmt.Errorf("libvirt: region %s host %s: %w", d.opts.Region.ID, h.cfg.Name, err)
		}
	}
	return nil
}

// several reports whether the region has more than one host: a region of one has nothing to
// place or route.
func (d *Driver) several() bool { return len(d.hosts) > 1 }

// hostOf finds the host that holds the server: the one whose index has it (a host that cannot
// be reached then answers ErrUnreachable), else the first connected host that has its domain.
// While a host cannot be reached, a server found nowhere else may be there: ErrUnreachable,
// not ErrServerNotFound.
func (d *Driver) hostOf(op, id string) (*hostDriver, error) {
	if !d.several() {
		return d.hosts[0], nil
	}
	for _, h := range d.hosts {
		if _, ok := h.index.get(id); ok {
			return h, nil
		}
	}
	var away error
	for _, h := range d.hosts {
		conn, err := h.host(op)
		if err != nil {
			away = err
			continue
		}
		_, err = h.lookup(conn, id)
		if err == nil {
			return h, nil
		}
		if !errors.Is(err, region.ErrServerNotFound) {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	if away != nil {
		return nil, away
	}
	return nil, fmt.Errorf("%s: server %s: %w", op, id, region.ErrServerNotFound)
}

// FindServers implements region.Client: every host's servers in scope with the tag. A host
// that cannot be reached makes the answer ErrUnreachable when it may hold one of them.
func (d *Driver) FindServers(ctx context.Context, scope region.Scope, tag, value string) ([]region.Server, error) {
	var out []region.Server
	for _, h := range d.hosts {
		found, err := h.FindServers(ctx, scope, tag, value)
		if errors.Is(err, region.ErrUnreachable) && d.several() {
			maybe, merr := h.mayHold(ctx, tag, value)
			if merr != nil {
				return nil, fmt.Errorf("find servers: %w", merr)
			}
			if maybe {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, found...)
	}
	return out, nil
}

// Servers implements region.Lister: every host's servers, or an error while any host cannot
// be reached.
func (d *Driver) Servers(ctx context.Context) ([]region.Server, error) {
	var out []region.Server
	for _, h := range d.hosts {
		servers, err := h.Servers(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, servers...)
	}
	return out, nil
}

// CreateServer implements region.Client: the server goes to the connected host with the most
// free memory that has room for its flavor (a snapshot's server to the host whose pool holds
// the snapshot). When none has room, it is ErrNoCapacity naming the region and the flavor;
// when none can be reached, ErrUnreachable.
func (d *Driver) CreateServer(ctx context.Context, spec region.ServerSpec) (region.Server, error) {
	if !d.several() {
		return d.hosts[0].CreateServer(ctx, spec)
	}
	r, err := d.hosts[0].resolve(ctx, spec)
	if err != nil {
		return region.Server{}, err
	}
	pinned, err := d.imageHost(ctx, spec.ImageID)
	if err != nil {
		return region.Server{}, fmt.Errorf("create server: %w", err)
	}
	h, placed, err := d.place(r.flavor, pinned)
	if err != nil {
		return region.Server{}, err
	}
	defer placed()
	// Recorded before the host is asked, so that a host that goes away while it makes the
	// server is known to hold it, and again once it has: a delete of another server of the
	// instance meanwhile, which did not see this one, may have removed it.
	instanceID := spec.Tags[region.InstanceTag]
	if err := h.addInstance(ctx, instanceID); err != nil {
		return region.Server{}, fmt.Errorf("create server: %w", err)
	}
	srv, err := h.create(ctx, spec, r)
	if err != nil {
		return srv, err
	}
	if err := h.addInstance(ctx, instanceID); err != nil {
		return region.Server{}, fmt.Errorf("create server: %w", err)
	}
	return srv, nil
}

// place chooses the host for a server of the flavor (only pinned, when not nil) and admits
// it there until placed is called. Choices are serialised, so that creates at once see each
// other's servers pending on the hosts they chose and spread.
func (d *Driver) place(flavor *region.Flavor, pinned *hostDriver) (h *hostDriver, placed func(), err error) {
	d.placing.Lock()
	defer d.placing.Unlock()
	type room struct {
		h       *hostDriver
		freeKiB uint64
	}
	var rooms []room
	for _, h := range d.hosts {
		if pinned != nil && h != pinned {
			continue
		}
		free, err := h.room(flavor)
		switch {
		case errors.Is(err, region.ErrUnreachable), errors.Is(err, region.ErrNoCapacity):
		case err != nil:
			return nil, nil, fmt.Errorf("create server: %w", err)
		default:
			rooms = append(rooms, room{h, free})
		}
	}
	slices.SortStableFunc(rooms, func(a, b room) int { return cmp.Compare(b.freeKiB, a.freeKiB) })
	for _, r := range rooms {
		placed, err := r.h.admit(flavor)
		if err == nil {
			return r.h, placed, nil
		}
		if !errors.Is(err, region.ErrNoCapacity) && !errors.Is(err, region.ErrUnreachable) {
			return nil, nil, fmt.Errorf("create server: %w", err)
		}
	}
	if pinned != nil && !pinned.answering() {
		return nil, nil, pinned.errUnreachable("create server from a snapshot in its pool")
	}
	if pinned == nil && !d.anyAnswering() {
		return nil, nil, fmt.Errorf("create server: no host of region %s can be reached: %w", d.opts.Region.ID, region.ErrUnreachable)
	}
	return nil, nil, fmt.Errorf("no host of region %s has room for flavor %s: %w", d.opts.Region.ID, flavor.ID, region.ErrNoCapacity)
}

// anyAnswering reports whether a host of the region is connected and not held up.
func (d *Driver) anyAnswering() bool {
	for _, h := range d.hosts {
		if h.answering() {
			return true
		}
	}
	return false
}

// imageHost is the host whose pool holds the snapshot an image id names, or nil for an image
// of the catalogue (every host imports it) or an id that names nothing (the create refuses it).
func (d *Driver) imageHost(ctx context.Context, imageID string) (*hostDriver, error) {
	if _, ok := d.opts.Catalog.Image(imageID); ok {
		return nil, nil
	}
	rec, found, err := d.hosts[0].readSnapshotRecord(ctx, imageID)
	if err != nil || !found {
		return nil, err
	}
	return d.recordHost(rec), nil
}

// recordHost is the host that holds an image's volume: the one its record names, else the
// first (an image recorded before the region named its hosts, or of a host taken out of it,
// whose delete then only forgets the record).
func (d *Driver) recordHost(rec *snapshotRecord) *hostDriver {
	for _, h := range d.hosts {
		if h.owns(rec) {
			return h
		}
	}
	return d.hosts[0]
}

// DeleteServer implements region.Client. Once the host holds no server of the instance any
// more, the host is no longer one that may hold it.
func (d *Driver) DeleteServer(ctx context.Context, id string) error {
	h, err := d.hostOf("delete server", id)
	if errors.Is(err, region.ErrServerNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	instanceID := h.instanceOf(id)
	if err := h.DeleteServer(ctx, id); err != nil {
		return err
	}
	return h.removeInstance(ctx, instanceID, h.opts.Now().Add(-recentlyAdded))
}

// routed makes a call about a server on the host that holds it.
func routed[T any](d *Driver, op, id string, call func(*hostDriver) (T, error)) (T, error) {
	h, err := d.hostOf(op, id)
	if err != nil {
		var none T
		return none, err
	}
	return call(h)
}

// GetServer implements region.Client.
func (d *Driver) GetServer(ctx context.Context, id string) (region.Server, error) {
	return routed(d, "get server", id, func(h *hostDriver) (region.Server, error) { return h.GetServer(ctx, id) })
}

// UpdateNetworking implements region.Client.
func (d *Driver) UpdateNetworking(ctx context.Context, id string, n region.ServerNetworking) (region.Server, error) {
	return routed(d, "update networking", id, func(h *hostDriver) (region.Server, error) { return h.UpdateNetworking(ctx, id, n) })
}

// StartServer implements region.Client.
func (d *Driver) StartServer(ctx context.Context, id string) (region.Server, error) {
	return routed(d, "start server", id, func(h *hostDriver) (region.Server, error) { return h.StartServer(ctx, id) })
}

// StopServer implements region.Client.
func (d *Driver) StopServer(ctx context.Context, id string) (region.Server, error) {
	return routed(d, "stop server", id, func(h *hostDriver) (region.Server, error) { return h.StopServer(ctx, id) })
}

// RebootServer implements region.Client.
func (d *Driver) RebootServer(ctx context.Context, id string, hard bool) (region.Server, error) {
	return routed(d, "reboot server", id, func(h *hostDriver) (region.Server, error) { return h.RebootServer(ctx, id, hard) })
}

// ResizeServer implements region.Client: the server stays on its host, which must have room
// for the new flavor.
func (d *Driver) ResizeServer(ctx context.Context, id, flavorID string) (region.Server, error) {
	return routed(d, "resize server", id, func(h *hostDriver) (region.Server, error) { return h.ResizeServer(ctx, id, flavorID) })
}

// ConsoleOutput implements region.Client.
func (d *Driver) ConsoleOutput(ctx context.Context, id string, tailBytes int) (region.ConsoleOutput, error) {
	return routed(d, "console output", id, func(h *hostDriver) (region.ConsoleOutput, error) { return h.ConsoleOutput(ctx, id, tailBytes) })
}

// OpenConsole implements region.Client.
func (d *Driver) OpenConsole(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	return routed(d, "open console", id, func(h *hostDriver) (io.ReadWriteCloser, error) { return h.OpenConsole(ctx, id) })
}

// SSHKey implements region.Client.
func (d *Driver) SSHKey(ctx context.Context, id string) (region.SSHKey, error) {
	return routed(d, "ssh key", id, func(h *hostDriver) (region.SSHKey, error) { return h.SSHKey(ctx, id) })
}

// Snapshot implements region.Client: the image's volume is in the pool of the server's host,
// where servers made from it then go.
func (d *Driver) Snapshot(ctx context.Context, id string, req region.ImageRequest) (region.Image, error) {
	return routed(d, "snapshot", id, func(h *hostDriver) (region.Image, error) { return h.Snapshot(ctx, id, req) })
}

// Images implements region.Client: the region's records of its images, which every host
// shares; ErrUnreachable while no host can be reached.
func (d *Driver) Images(ctx context.Context, org, project string) ([]region.Image, error) {
	var err error
	for _, h := range d.hosts {
		var images []region.Image
		if images, err = h.Images(ctx, org, project); !errors.Is(err, region.ErrUnreachable) {
			return images, err
		}
	}
	return nil, err
}

// DeleteImage implements region.Client, on the host whose pool holds the image.
func (d *Driver) DeleteImage(ctx context.Context, org, project, id string) error {
	h := d.hosts[0]
	if d.several() {
		rec, found, err := h.readSnapshotRecord(ctx, id)
		if err != nil {
			return fmt.Errorf("delete image: %w", err)
		}
		if found {
			h = d.recordHost(rec)
		}
	}
	return h.DeleteImage(ctx, org, project, id)
}

// Watch implements region.Client. The hosts keep no history of their events, so a cursor
// cannot be replayed: a watch that resumes (after is not "") first reports every server of
// every host as updated, which makes its watcher look at each of them again, and then follows
// new events.
func (d *Driver) Watch(ctx context.Context, after string, fn func(region.Event) error) error {
	ch := d.watches.subscribe()
	defer d.watches.unsubscribe(ch)
	if after != "" {
		for _, h := range d.hosts {
			for _, s := range h.index.all() {
				if err := fn(region.Event{Cursor: after, Kind: region.ServerUpdated, ServerID: s.id, Scope: s.scope, Tags: s.tags}); err != nil {
					return err
				}
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-ch:
			if !ok {
				return fmt.Errorf("watch: fell more than %d events behind: %w", watchBuffer, region.ErrUnavailable)
			}
			if err := fn(ev); err != nil {
				return err
			}
		}
	}
}

// addressesElsewhere returns the addresses the hosts of the region other than self hold in a
// network, with their MACs: an address is the region's, not a host's, so no two servers of a
// network share one whichever hosts they are on.
func (d *Driver) addressesElsewhere(self *hostDriver) func(network string) map[string]string {
	return func(network string) map[string]string {
		held := map[string]string{}
		for _, h := range d.hosts {
			if h != self {
				h.addresses(network, held)
			}
		}
		return held
	}
}

// addresses adds the addresses the host holds in the network to held: its reservations while
// it answers, else those of the servers this process last saw there.
func (d *hostDriver) addresses(network string, held map[string]string) {
	if conn, err := d.answeringHost(""); err == nil {
		if _, hosts, err := reservationsOf(conn, network); err == nil {
			for _, h := range hosts {
				held[h.IP] = h.MAC
			}
			return
		}
	}
	for _, s := range d.index.all() {
		if s.network == network && s.ip != "" {
			held[s.ip] = s.mac
		}
	}
}

// room is how much memory the host has free beside what it holds and what this process is
// making on it, when it has room for the flavor (else ErrNoCapacity, or ErrUnreachable).
func (d *hostDriver) room(f *region.Flavor) (uint64, error) {
	conn, err := d.answeringHost("host capacity")
	if err != nil {
		return 0, err
	}
	d.mu.RLock()
	pool := d.pool
	d.mu.RUnlock()
	d.placing.Lock()
	defer d.placing.Unlock()
	return d.capacity(conn, pool, f, d.pending)
}
