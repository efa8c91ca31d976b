package libvirt

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
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
			h.addressTaken = d.takenElsewhere(h)
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
	// server is known to hold it.
	if err := h.addInstance(ctx, spec.Tags[region.InstanceTag]); err != nil {
		return region.Server{}, fmt.Errorf("create server: %w", err)
	}
	return h.create(ctx, spec, r)
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
	if !d.anyConnected(pinned) {
		return nil, nil, fmt.Errorf("create server: no host of region %s that could hold it can be reached: %w", d.opts.Region.ID, region.ErrUnreachable)
	}
	return nil, nil, fmt.Errorf("no host of region %s has room for flavor %s: %w", d.opts.Region.ID, flavor.ID, region.ErrNoCapacity)
}

// anyConnected reports whether a host that may take a server (only pinned, when not nil) is
// connected.
func (d *Driver) anyConnected(pinned *hostDriver) bool {
	for _, h := range d.hosts {
		if (pinned == nil || h == pinned) && h.Connected() {
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
	known, _ := h.index.get(id)
	if err := h.DeleteServer(ctx, id); err != nil {
		return err
	}
	return h.removeInstance(ctx, known.tags[region.InstanceTag])
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

// takenElsewhere reports whether a host of the region other than self holds an address of a
// network (by the network's name on the hosts) for another MAC: an address is the region's,
// not a host's, so no two servers of a network share one whichever hosts they are on.
func (d *Driver) takenElsewhere(self *hostDriver) func(network, ip, mac string) bool {
	return func(network, ip, mac string) bool {
		for _, h := range d.hosts {
			if h != self && h.holdsAddress(network, ip, mac) {
				return true
			}
		}
		return false
	}
}

// The hosts' sets of instances (hostInstancesKey), kept only in a region of several hosts.

// addInstance records that the host may hold a server of the instance.
func (d *hostDriver) addInstance(ctx context.Context, instanceID string) error {
	if d.instancesKey == "" || instanceID == "" {
		return nil
	}
	if err := d.opts.Redis.SAdd(ctx, d.instancesKey, instanceID).Err(); err != nil {
		return fmt.Errorf("record the host of instance %s: %v: %w", instanceID, err, region.ErrUnavailable)
	}
	return nil
}

// removeInstance records that the host holds no server of the instance, unless it still does.
func (d *hostDriver) removeInstance(ctx context.Context, instanceID string) error {
	if d.instancesKey == "" || instanceID == "" || d.index.tagged(region.InstanceTag, instanceID) {
		return nil
	}
	if err := d.opts.Redis.SRem(ctx, d.instancesKey, instanceID).Err(); err != nil {
		return fmt.Errorf("forget the host of instance %s: %v: %w", instanceID, err, region.ErrUnavailable)
	}
	return nil
}

// mayHold reports whether the host, which cannot be reached, may hold a server with the tag:
// this process last saw one there, or the host's set of instances has it. Only the instance
// tag is recorded, so for any other tag the host may.
func (d *hostDriver) mayHold(ctx context.Context, tag, value string) (bool, error) {
	if tag != region.InstanceTag || d.index.tagged(tag, value) {
		return true, nil
	}
	in, err := d.opts.Redis.SIsMember(ctx, d.instancesKey, value).Result()
	if err != nil {
		return false, fmt.Errorf("the hosts of instance %s: %v: %w", value, err, region.ErrUnavailable)
	}
	return in, nil
}

// recordInstances adds the instances of the servers the host holds to its set, as it connects:
// the host is the truth, and servers made before the region had several hosts are recorded too.
func (d *hostDriver) recordInstances(ctx context.Context, servers []indexed) error {
	if d.instancesKey == "" {
		return nil
	}
	var ids []any
	for _, s := range servers {
		if id := s.tags[region.InstanceTag]; id != "" {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	return d.opts.Redis.SAdd(ctx, d.instancesKey, ids...).Err()
}

// holdsAddress reports whether the host holds the address in the network for a MAC other than
// mac: by its reservations while connected, else by the servers this process last saw there.
// A host that fails to answer is taken to hold it, so that the address is not handed out twice.
func (d *hostDriver) holdsAddress(network, ip, mac string) bool {
	conn, err := d.host("")
	if err != nil {
		for _, s := range d.index.all() {
			if s.network == network && s.ip == ip && s.mac != mac {
				return true
			}
		}
		return false
	}
	_, hosts, err := reservationsOf(conn, network)
	if err != nil {
		return true
	}
	for _, h := range hosts {
		if h.IP == ip && !strings.EqualFold(h.MAC, mac) {
			return true
		}
	}
	return false
}

// room is how much memory the host has free beside what it holds and what this process is
// making on it, when it has room for the flavor (else ErrNoCapacity, or ErrUnreachable).
func (d *hostDriver) room(f *region.Flavor) (uint64, error) {
	conn, err := d.host("host capacity")
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
