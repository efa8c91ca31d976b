// Package libvirt is a region driver for a libvirt host running QEMU: servers are libvirt
// domains, disks are qcow2 overlays of base volumes in a storage pool, networks are libvirt
// NAT networks whose DHCP hands each server the address the driver reserved for it, and user
// data and keys reach the guest through a cloud-init NoCloud seed attached as a second disk.
//
// The host is the truth. A domain's metadata holds the server's scope, tags and spec; the
// driver keeps only an index from tag to domain, rebuilt from the host whenever it connects
// and kept current by the host's lifecycle events, so every process serving the region sees
// every server, whoever made it.
package libvirt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/libvirt/dial"
)

// Options configure a driver.
type Options struct {
	// Region is the catalogue region the driver serves, with its libvirt settings. Required.
	Region region.Region
	// Catalog resolves flavors, images and networks. Required.
	Catalog *region.Catalog
	// Redis keeps each project's SSH key pair, which every process must hand out alike.
	// Required.
	Redis redis.UniversalClient
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
	// Retry is how long to wait before dialling the host again after it went away. Defaults
	// to 2s.
	Retry time.Duration
	// Tick is how often stops past their timeout are forced, and soft reboots looked at (a
	// guest that powered off is started, one past the timeout reset). Defaults to 1s.
	Tick time.Duration
	// ConnectTimeout bounds connecting to the host and reading its state at the start of each
	// connection; a host that takes longer is dialled again. Defaults to 1m.
	ConnectTimeout time.Duration
	// StuckTimeout is how long a trivial call on the driver's connection may go unanswered
	// while the host answers on the heartbeat's before the connection is cut and dialled
	// again: libvirtd reads only a few calls of one connection at once (max_client_requests,
	// 5 by default), so calls waiting on a guest that does not answer hold up every call behind
	// them. Keep it longer than libvirt's 30 s wait for a domain's job, after which calls
	// queued on a busy domain give up by themselves. Defaults to 2m.
	StuckTimeout time.Duration
}

// hostDriver is one host of a libvirt region. Its methods are safe for concurrent use; Run
// keeps its connection to the host, and until Run has connected every call is ErrUnavailable.
type hostDriver struct {
	opts Options
	// cfg is the host's entry in the region's settings.
	cfg region.LibvirtHost
	// keyHost names the host in Redis keys of what its pool holds; "" for a region that
	// names its one host by uri alone, whose keys predate several hosts.
	keyHost string
	// first is the region's first host, which owns the images recorded before hosts were
	// named.
	first       bool
	uri         region.LibvirtURI
	stopTimeout time.Duration
	// buildTimeout is how long a guest has to take its address once started.
	buildTimeout time.Duration
	log          *slog.Logger

	mu    sync.RWMutex
	conn  *golibvirt.Libvirt // nil while the host cannot be reached
	accel string             // "kvm" or "qemu", the domain type, decided at connect
	pool  golibvirt.StoragePool
	// jobs runs the connection's background work (the copies and merges of snapshots); nil
	// while the host cannot be reached. The session that made it waits for it as it ends.
	jobs *jobGroup
	// recovering is set while a pass of recoverSnapshots runs.
	recovering atomic.Bool
	// heldUp is set while a question on the connection has gone unanswered for a heartbeat
	// or more though the host answers the heartbeat: placements and the other hosts' address
	// checks pass the host by rather than wait behind the calls held up on it.
	heldUp atomic.Bool

	index *index
	// watches is the region's: every host's events go to every watch of the region.
	watches *broadcaster
	// stopping are the servers whose graceful stop this process watches, to force them off
	// after the stop timeout.
	stopping idSet
	// rebooting are the servers whose soft reboot this process watches (RebootServer).
	rebooting idSet
	// building are the servers this process watches for the lease that makes them RUNNING:
	// the host has no event for it.
	building idSet
	// downloads, consoles and copies bound the console downloads, attached consoles and
	// snapshots' disk copies, each on a connection of its own (streams).
	downloads, consoles, copies *streams
	// allocate serialises this process's address reservations; the host refuses a duplicate
	// reservation from another process, and the next address is tried.
	allocate sync.Mutex
	// instancesKey is the host's set of instances (hostInstancesKey); "" in a region of one
	// host.
	instancesKey string
	// elsewhere returns the addresses the region's other hosts hold in a network (by its name
	// on the hosts), each with its MAC; nil in a region of one host.
	elsewhere func(network string) map[string]string
	// imports serialises this process's image imports, apart from reservations: an import can
	// take minutes.
	imports sync.Mutex
	// records serialises this process's changes of servers' records.
	records sync.Mutex
	// placing serialises this process's capacity checks; pending is what the servers it
	// admitted and has not defined yet will take of the host.
	placing sync.Mutex
	pending placement
	// unowned are the DHCP reservations (reservation|network|mac) and network filters
	// (filter|name) that no domain held at a collection pass, with when that was first seen;
	// only the session's goroutine touches it.
	unowned map[string]time.Time
}

// newHost returns the driver of one host of the region; it connects when Run starts.
func newHost(opts Options, cfg region.LibvirtHost, keyHost string, watches *broadcaster) (*hostDriver, error) {
	r := opts.Region
	uri, err := region.ParseLibvirtURI(cfg.URI)
	if err != nil {
		return nil, fmt.Errorf("libvirt: region %q host %q: %w", r.ID, cfg.Name, err)
	}
	stop, err := time.ParseDuration(r.Libvirt.StopTimeout)
	if err != nil || stop <= 0 {
		return nil, fmt.Errorf("libvirt: region %q: stopTimeout %q is not a positive duration", r.ID, r.Libvirt.StopTimeout)
	}
	build, err := time.ParseDuration(r.Libvirt.BuildTimeout)
	if err != nil || build <= 0 {
		return nil, fmt.Errorf("libvirt: region %q: buildTimeout %q is not a positive duration", r.ID, r.Libvirt.BuildTimeout)
	}
	log := opts.Logger.With("region", r.ID)
	if keyHost != "" {
		log = log.With("host", cfg.Name)
	}
	return &hostDriver{
		opts: opts, cfg: cfg, keyHost: keyHost, uri: uri, stopTimeout: stop, buildTimeout: build, log: log,
		index: newIndex(), watches: watches, unowned: map[string]time.Time{},
		downloads: newStreams("console downloads", consoleDownloads, abandonedStreams),
		consoles:  newStreams("consoles", consoleStreams, abandonedStreams),
		copies:    newStreams("disk copies", diskCopies, abandonedStreams),
	}, nil
}

// errUnreachable is every call's answer while the host cannot be reached.
func (d *hostDriver) errUnreachable(op string) error {
	if d.keyHost != "" {
		return fmt.Errorf("%s: libvirt %w", op, d.unreachable())
	}
	return fmt.Errorf("%s: libvirt host of region %s: %w", op, d.opts.Region.ID, region.ErrUnreachable)
}

// unreachable is the error of the host not answering: HostUnreachable, naming it, in a region
// that names its hosts.
func (d *hostDriver) unreachable() error {
	if d.keyHost != "" {
		return region.HostUnreachable{Region: d.opts.Region.ID, Host: d.cfg.Name}
	}
	return region.ErrUnreachable
}

// host returns the connection, or ErrUnavailable while there is none.
func (d *hostDriver) host(op string) (*golibvirt.Libvirt, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.conn == nil {
		return nil, d.errUnreachable(op)
	}
	return d.conn, nil
}

// Connected reports whether the driver is connected to its host.
func (d *hostDriver) Connected() bool {
	_, err := d.host("")
	return err == nil
}

// fault wraps an error of a call to the host: a lost connection is ErrUnreachable, so that
// callers wait and retry, anything else is the host's refusal or failure as it said it.
func (d *hostDriver) fault(op string, err error) error {
	if err == nil {
		return nil
	}
	var lerr golibvirt.Error
	if errors.As(err, &lerr) {
		return fmt.Errorf("%s: %w", op, err)
	}
	return fmt.Errorf("%s: %v: %w", op, err, d.unreachable())
}

// Run keeps the driver connected to its host until ctx ends: it dials, prepares the storage
// pool, rebuilds the index from the host's domains, tells watchers to look at every server
// again (nothing that happened while disconnected is missed), then follows the host's
// lifecycle events and forces stops past their timeout, and dials again when the host goes
// away.
func (d *hostDriver) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		err := d.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		d.log.WarnContext(ctx, "libvirt host connection lost; dialling again", "err", err, "retry", d.opts.Retry)
		t := time.NewTimer(d.opts.Retry)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

// dialer reaches the host's daemon; Cut ends the connection it made.
func (d *hostDriver) dialer() *dial.CutDialer {
	cut := &dial.CutDialer{Network: d.uri.Network, Address: d.uri.Address, Timeout: heartbeat}
	if d.uri.Network == "ssh" {
		cut.Network, cut.Through = "tcp", sshThrough(d.uri.SSH, d.uri.Address, heartbeat)
	}
	return cut
}

// session is one connection's life.
func (d *hostDriver) session(parent context.Context) error {
	// The heartbeat asks on a connection of its own: libvirtd reads only a few calls of one
	// connection at once, and on the driver's its question would wait behind calls held up by
	// one guest that does not answer, which would pass for the whole host not answering.
	cut, beatCut := d.dialer(), d.dialer()
	cutBoth := func() { cut.Cut(); beatCut.Cut() }
	// go-libvirt's calls carry no deadline, and a host that accepts the connection without
	// answering (a libvirtd still starting, or hung) would hold the connecting calls below for
	// ever; cutting the connection fails them all. The heartbeat takes over once connected.
	watchdog := time.AfterFunc(d.opts.ConnectTimeout, cutBoth)
	defer watchdog.Stop()
	conn, beatConn := golibvirt.NewWithDialer(cut), golibvirt.NewWithDialer(beatCut)
	if err := conn.ConnectToURI(golibvirt.ConnectURI(d.uri.Name)); err != nil {
		cutBoth()
		return fmt.Errorf("connect %s %s: %w", d.uri.Network, d.uri.Address, err)
	}
	if err := beatConn.ConnectToURI(golibvirt.ConnectURI(d.uri.Name)); err != nil {
		cutBoth()
		return fmt.Errorf("connect %s %s for the heartbeat: %w", d.uri.Network, d.uri.Address, err)
	}
	// The session's own context ends the event subscriptions with it; their goroutines send
	// each event unconditionally, so the channels are drained until they close.
	ctx, cancel := context.WithCancel(parent)
	var events <-chan golibvirt.DomainEventLifecycleMsg
	var changes <-chan any
	var jobs *jobGroup
	defer func() {
		cancel()
		if events != nil {
			go func() {
				for range events {
				}
			}()
		}
		if changes != nil {
			go func() {
				for range changes {
				}
			}()
		}
		var hangingUp sync.WaitGroup
		hangingUp.Go(func() { hangUp(conn, cut) })
		hangingUp.Go(func() { hangUp(beatConn, beatCut) })
		hangingUp.Wait()
		// Last: a job in a call to the host returns when the call does, which the connection
		// ending fails at once; a disk copy's connection of its own is cut as the jobs'
		// context ends (copyDisk).
		if jobs != nil {
			jobs.wg.Wait()
		}
	}()
	events, err := conn.LifecycleEvents(ctx)
	if err != nil {
		return fmt.Errorf("subscribe to lifecycle events: %w", err)
	}
	// A server's record changes without its domain's state changing (its networking, the
	// moment it is seen built): every process hears of it through the metadata's event.
	changes, err = conn.SubscribeEvents(ctx, golibvirt.DomainEventIDMetadataChange, golibvirt.OptDomain{})
	if err != nil {
		return fmt.Errorf("subscribe to metadata events: %w", err)
	}
	accel, err := d.acceleration(conn)
	if err != nil {
		return err
	}
	pool, err := d.ensurePool(conn)
	if err != nil {
		return err
	}
	servers, err := d.listServers(conn)
	if err != nil {
		return err
	}
	all := make([]indexed, len(servers))
	for i, s := range servers {
		all[i] = s.indexed()
		if !s.rec.StopBy.IsZero() {
			d.stopping.add(s.id) // a stop whose process went away is finished here
		}
		if !s.rec.RebootBy.IsZero() {
			d.rebooting.add(s.id) // and so is a reboot
		}
		if !s.rec.Built && s.rec.Error == "" {
			d.building.add(s.id)
		}
	}
	// Servers deleted while the host could not be reached are reported deleted.
	for _, gone := range d.index.replace(all) {
		d.release(conn, gone) // only a previous session indexed it, which set the pool
		d.watches.publish(region.Event{Kind: region.ServerDeleted, ServerID: gone.id, Scope: gone.scope, Tags: gone.tags})
	}
	if err := d.recordInstances(ctx, all); err != nil {
		return fmt.Errorf("record the host's instances: %w", err)
	}
	if _, err := d.forgetInstances(ctx); err != nil {
		return fmt.Errorf("forget instances the host no longer holds: %w", err)
	}
	jobCtx, stopJobs := context.WithCancel(ctx)
	jobs = &jobGroup{ctx: jobCtx}
	d.mu.Lock()
	d.conn, d.accel, d.pool, d.jobs = conn, accel, pool, jobs
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.conn, d.jobs = nil, nil
		d.mu.Unlock()
		stopJobs()
		// Their owners look again, learn that the host cannot be reached and say so, rather
		// than showing what was last seen as if it were current.
		for _, s := range d.index.all() {
			d.watches.publish(region.Event{Kind: region.ServerUpdated, ServerID: s.id, Scope: s.scope, Tags: s.tags})
		}
	}()
	d.log.InfoContext(ctx, "connected to libvirt host", "uri", d.cfg.URI, "domain_type", accel, "servers", len(servers))
	for _, s := range all {
		d.watches.publish(region.Event{Kind: region.ServerUpdated, ServerID: s.id, Scope: s.scope, Tags: s.tags})
	}
	watchdog.Stop()
	d.recover(jobs, conn, pool)
	tick := time.NewTicker(d.opts.Tick)
	defer tick.Stop()
	collect := time.NewTicker(orphanAge / 2)
	defer collect.Stop()
	// The heartbeat runs beside the loop: a host that stops answering while the loop waits on
	// it (an event's lookup, a collection pass) is cut all the same, which fails that call and
	// every other one waiting on the host, here or in the region's other hosts' placements.
	beatCtx, stopBeat := context.WithCancel(ctx)
	var beating sync.WaitGroup
	defer func() {
		stopBeat()
		beating.Wait()
	}()
	beating.Go(func() { d.beat(beatCtx, jobs, conn, beatConn, cutBoth) })
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-conn.Disconnected():
			return errors.New("disconnected")
		case <-beatConn.Disconnected():
			return errors.New("the heartbeat's connection was lost")
		case ev, ok := <-events:
			if !ok {
				return errors.New("lifecycle events ended")
			}
			d.lifecycle(conn, ev)
		case ev, ok := <-changes:
			if !ok {
				return errors.New("metadata events ended")
			}
			if msg, ok := ev.(*golibvirt.DomainEventCallbackMetadataChangeMsg); ok {
				d.lifecycle(conn, golibvirt.DomainEventLifecycleMsg{Dom: msg.Dom, Event: int32(golibvirt.DomainEventResumed)})
			}
		case <-tick.C:
			d.forceStops(ctx, conn)
			d.finishReboots(ctx, conn)
			d.watchBuilds(conn)
		case <-collect.C:
			n, err := d.collectVolumes(conn, pool)
			if err != nil {
				d.log.WarnContext(ctx, "collect orphaned volumes", "err", err)
			}
			if n > 0 {
				d.log.WarnContext(ctx, "orphaned volumes deleted", "count", n)
			}
			n, err = d.collectReservations(conn)
			if err != nil {
				d.log.WarnContext(ctx, "collect orphaned DHCP reservations", "err", err)
			}
			if n > 0 {
				d.log.WarnContext(ctx, "orphaned DHCP reservations released", "count", n)
			}
			n, err = d.forgetInstances(ctx)
			if err != nil {
				d.log.WarnContext(ctx, "forget instances the host no longer holds", "err", err)
			}
			if n > 0 {
				d.log.InfoContext(ctx, "instances the host no longer holds forgotten", "count", n)
			}
			n, err = d.collectFilters(conn)
			if err != nil {
				d.log.WarnContext(ctx, "collect orphaned network filters", "err", err)
			}
			if n > 0 {
				d.log.WarnContext(ctx, "orphaned network filters undefined", "count", n)
			}
			d.recover(jobs, conn, pool)
		}
	}
}

// jobGroup is a session's background work: each job runs with the session's context, which
// ends with the session, and the session waits for every job before it returns.
type jobGroup struct {
	ctx context.Context
	wg  sync.WaitGroup
}

// Go runs fn as a job.
func (g *jobGroup) Go(fn func(context.Context)) { g.wg.Go(func() { fn(g.ctx) }) }

// recover runs a pass of recoverSnapshots as a job, unless one runs still.
func (d *hostDriver) recover(jobs *jobGroup, conn *golibvirt.Libvirt, pool golibvirt.StoragePool) {
	if !d.recovering.CompareAndSwap(false, true) {
		return
	}
	jobs.Go(func(ctx context.Context) {
		defer d.recovering.Store(false)
		n, err := d.recoverSnapshots(ctx, conn, pool)
		if err != nil && ctx.Err() == nil {
			d.log.WarnContext(ctx, "clean up snapshots cut short", "err", err)
		}
		if n > 0 {
			d.log.WarnContext(ctx, "snapshots cut short marked failed", "count", n)
		}
	})
}

// heartbeat is how often the host must answer a trivial call, and how long it has to: calls to
// the host carry no deadline of their own, so a host that stops answering without closing the
// connection would otherwise hold every call for as long as TCP takes to give up.
const heartbeat = 5 * time.Second

// beat asks the host for its version every heartbeat on the heartbeat's connection, and cuts
// both connections when it does not answer within the heartbeat. It also keeps a question
// under way on the driver's connection: while that one goes unanswered for a heartbeat the host
// is held up, and once for StuckTimeout both connections are cut, failing every call on them,
// which would otherwise wait as long as what holds them up.
func (d *hostDriver) beat(ctx context.Context, jobs *jobGroup, conn, beatConn *golibvirt.Libvirt, cutBoth func()) {
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	defer d.heldUp.Store(false)
	// asked is when the question under way on conn was asked; zero while none is. It is a
	// job of the session, which waits for it once the connection has ended, which fails it.
	var asked time.Time
	answered := make(chan struct{}, 1)
	for {
		select {
		case <-ctx.Done():
			return
		case <-answered:
			asked = time.Time{}
			d.heldUp.Store(false)
		case <-tick.C:
			if err := alive(beatConn); err != nil {
				d.log.WarnContext(ctx, "libvirt host stopped answering; cutting the connection", "err", err)
				cutBoth()
				return
			}
			if asked.IsZero() {
				asked = time.Now()
				jobs.Go(func(context.Context) {
					_, _ = conn.ConnectGetLibVersion()
					answered <- struct{}{}
				})
				continue
			}
			unanswered := time.Since(asked)
			if unanswered >= d.opts.StuckTimeout {
				d.log.WarnContext(ctx, "calls on the libvirt host's connection went unanswered while the host answers others; cutting the connection", "unanswered_for", unanswered)
				cutBoth()
				return
			}
			if unanswered >= heartbeat && !d.heldUp.Swap(true) {
				d.log.WarnContext(ctx, "calls on the libvirt host's connection are held up", "unanswered_for", unanswered)
			}
		}
	}
}

// answeringHost is host for what may pass the host by while its calls are held up (placement,
// the other hosts' address checks) rather than wait behind them: ErrUnreachable meanwhile.
func (d *hostDriver) answeringHost(op string) (*golibvirt.Libvirt, error) {
	if d.heldUp.Load() {
		return nil, d.errUnreachable(op + ": calls on the host are held up")
	}
	return d.host(op)
}

// answering reports whether the host is connected and its calls are not held up.
func (d *hostDriver) answering() bool {
	_, err := d.answeringHost("")
	return err == nil
}

// hangUp says goodbye on the connection, and cuts it: at once when the host does not answer
// within the heartbeat (a host that stopped answering would hold the goodbye for ever), and
// after it anyway, since go-libvirt leaves the socket open when the goodbye fails.
func hangUp(conn *golibvirt.Libvirt, cut *dial.CutDialer) {
	bye := make(chan struct{})
	go func() { conn.Disconnect(); close(bye) }()
	select {
	case <-bye:
	case <-time.After(heartbeat):
	}
	cut.Cut()
}

// alive asks the host for its version within the heartbeat.
func alive(conn *golibvirt.Libvirt) error {
	answered := make(chan error, 1)
	go func() {
		_, err := conn.ConnectGetLibVersion()
		answered <- err
	}()
	select {
	case err := <-answered:
		return err
	case <-time.After(heartbeat):
		return fmt.Errorf("the host did not answer within %s", heartbeat)
	}
}

// acceleration decides the domain type: kvm where asked for, qemu (TCG) where asked for, and
// for auto, kvm when the host offers it and, on a local host, its KVM is not the PVM variant,
// which cannot run stock guest kernels.
func (d *hostDriver) acceleration(conn *golibvirt.Libvirt) (string, error) {
	switch d.opts.Region.Libvirt.Accel {
	case region.AccelKVM:
		return "kvm", nil
	case region.AccelTCG:
		return "qemu", nil
	}
	caps, err := conn.ConnectGetCapabilities()
	if err != nil {
		return "", fmt.Errorf("read host capabilities: %w", err)
	}
	if !offersKVM(caps) {
		return "qemu", nil
	}
	if d.uri.Network == "unix" {
		if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
			return "qemu", nil
		}
	}
	return "kvm", nil
}

// listServers reads every server of the region on the host.
func (d *hostDriver) listServers(conn *golibvirt.Libvirt) ([]*server, error) {
	doms, _, err := conn.ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, fmt.Errorf("list domains: %w", err)
	}
	var out []*server
	for _, dom := range doms {
		s, err := readServer(conn, dom)
		switch {
		case errors.Is(err, errNotOurs), golibvirt.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("read domain %s: %w", dom.Name, err)
		}
		if s.rec.Spec.RegionID == d.opts.Region.ID {
			out = append(out, s)
		}
	}
	return out, nil
}
