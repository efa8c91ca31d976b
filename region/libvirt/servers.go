package libvirt

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/ssh"

	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/libvirt/nocloud"
)

// Capacity rules, as Nova's defaults have them: memory is never overcommitted and the host
// keeps some for itself; a vCPU may be shared by up to cpuAllocationRatio guest vCPUs.
const (
	hostReservedKiB    = 512 << 10
	cpuAllocationRatio = 16
)

// FindServers implements region.Client through the index.
func (d *hostDriver) FindServers(ctx context.Context, scope region.Scope, tag, value string) ([]region.Server, error) {
	conn, err := d.host("find servers")
	if err != nil {
		return nil, err
	}
	var out []region.Server
	for _, id := range d.index.find(scope, tag, value) {
		srv, err := d.get(conn, id)
		if errors.Is(err, region.ErrServerNotFound) {
			continue // deleted since it was indexed
		}
		if err != nil {
			return nil, fmt.Errorf("find servers: %w", err)
		}
		out = append(out, srv)
	}
	return out, nil
}

// Servers implements region.Lister: every server of the region, read from the host.
func (d *hostDriver) Servers(ctx context.Context) ([]region.Server, error) {
	conn, err := d.host("list servers")
	if err != nil {
		return nil, err
	}
	var out []region.Server
	for _, x := range d.index.all() {
		srv, err := d.get(conn, x.id)
		if errors.Is(err, region.ErrServerNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list servers: %w", err)
		}
		out = append(out, srv)
	}
	return out, nil
}

// GetServer implements region.Client.
func (d *hostDriver) GetServer(ctx context.Context, id string) (region.Server, error) {
	conn, err := d.host("get server")
	if err != nil {
		return region.Server{}, err
	}
	srv, err := d.get(conn, id)
	if err != nil {
		return region.Server{}, fmt.Errorf("get server: %w", err)
	}
	return srv, nil
}

// lookup reads the server with the id from the host.
func (d *hostDriver) lookup(conn *golibvirt.Libvirt, id string) (*server, error) {
	u, ok := parseUUID(id)
	if !ok {
		return nil, fmt.Errorf("server %q: %w", id, region.ErrServerNotFound)
	}
	dom, err := conn.DomainLookupByUUID(u)
	if golibvirt.IsNotFound(err) {
		return nil, fmt.Errorf("server %s: %w", id, region.ErrServerNotFound)
	}
	if err != nil {
		return nil, d.fault("look up server "+id, err)
	}
	s, err := readServer(conn, dom)
	switch {
	case errors.Is(err, errNotOurs), golibvirt.IsNotFound(err):
		return nil, fmt.Errorf("server %s: %w", id, region.ErrServerNotFound)
	case err != nil:
		return nil, d.fault("read server "+id, err)
	}
	if s.rec.Spec.RegionID != d.opts.Region.ID {
		return nil, fmt.Errorf("server %s: %w", id, region.ErrServerNotFound)
	}
	return s, nil
}

func (d *hostDriver) get(conn *golibvirt.Libvirt, id string) (region.Server, error) {
	s, err := d.lookup(conn, id)
	if err != nil {
		return region.Server{}, err
	}
	return d.observe(conn, s), nil
}

// observe is the region's view of a server. A server is BUILDING until its guest takes the
// address reserved for it; the first time it is seen to, that is recorded, so that every
// process agrees it was built.
func (d *hostDriver) observe(conn *golibvirt.Libvirt, s *server) region.Server {
	if s.state == golibvirt.DomainRunning && !s.rec.Built && s.rec.Error == "" {
		if ok, err := leased(conn, s.rec.Network, s.rec.MAC, s.rec.IP); err == nil && ok {
			if err := d.updateRecord(conn, s, func(r *record) { r.Built, r.Stalled = true, "" }); err != nil {
				d.log.Warn("record that a server was built", "server", s.id, "err", err)
			}
		}
	}
	state, msg := s.regionState()
	srv := region.Server{
		ID: s.id, ServerSpec: s.rec.Spec, State: state, Message: msg, Health: region.HealthUnknown,
		MAC: s.rec.MAC, CreatedAt: s.rec.CreatedAt,
	}
	if s.rec.Built {
		srv.PrivateIP = s.rec.IP
	}
	switch state {
	case region.ServerRunning:
		srv.Health = region.HealthHealthy
		if s.agentConnected() {
			if _, err := conn.QEMUDomainAgentCommand(s.dom, `{"execute":"guest-ping"}`, 2, 0); err != nil {
				srv.Health = region.HealthDegraded
			}
		}
	case region.ServerError:
		srv.Health = region.HealthError
	}
	return srv
}

// CreateServer implements region.Client. What the host refuses for the server itself (an
// image volume missing, a full pool, a domain that does not start) makes a server in ERROR
// that says why and holds nothing: no disk, seed or address reservation is left behind.
// A host too full for the flavor is ErrNoCapacity, and nothing is made.
func (d *hostDriver) CreateServer(ctx context.Context, spec region.ServerSpec) (region.Server, error) {
	if _, err := d.host("create server"); err != nil {
		return region.Server{}, err
	}
	r, err := d.resolve(ctx, spec)
	if err != nil {
		return region.Server{}, err // a refusal, in users' words, or the host failing
	}
	placed, err := d.admit(r.flavor)
	if err != nil {
		return region.Server{}, err // says what is short, as users read it
	}
	defer placed()
	return d.create(ctx, spec, r)
}

// create makes the server of a resolved spec on the host, which admitted its flavor.
func (d *hostDriver) create(ctx context.Context, spec region.ServerSpec, r resolved) (region.Server, error) {
	conn, err := d.host("create server")
	if err != nil {
		return region.Server{}, err
	}
	d.mu.RLock()
	pool, domainType := d.pool, d.accel
	d.mu.RUnlock()
	network, flavor, image := r.network, r.flavor, r.image
	seed, err := d.seed(ctx, spec)
	if err != nil {
		return region.Server{}, err // a refusal, in users' words, or Redis unavailable
	}
	id := uuid.NewString()
	name := namePrefix + id
	now := d.opts.Now().UTC()
	rec := &record{Spec: spec, CreatedAt: now, BuildBy: now.Add(d.buildTimeout), MAC: randomMAC(), Network: networkName(network)}
	net, err := d.ensureNetwork(conn, network)
	if err != nil {
		return region.Server{}, d.fault("create server", err)
	}
	if rec.IP, err = d.reserve(conn, net, network, rec.MAC); errors.Is(err, region.ErrNoCapacity) {
		return region.Server{}, fmt.Errorf("network %s has %w", network.ID, err)
	} else if errors.Is(err, region.ErrUnavailable) {
		return region.Server{}, fmt.Errorf("create server: %w", err)
	} else if err != nil {
		return region.Server{}, d.fault("create server", err)
	}
	dom := domainSpec{name: name, id: id, domainType: domainType, flavor: flavor, image: image, rec: rec, network: rec.Network}
	built, err := d.build(ctx, conn, pool, dom, seed)
	if err == nil {
		d.building.add(built.id)
		return d.observe(conn, built), nil
	}
	// Undo everything, then keep a domain that only records why, so the owner sees the error.
	// A host that stopped answering is not the server's fault: that is retried instead.
	cleanup := errors.Join(deleteVolumes(conn, pool, rec.Volumes), release(conn, rec.Network, rec.MAC), undefineFilter(conn, id))
	if !errors.Is(err, region.ErrRefused) && !isHostError(err) {
		return region.Server{}, fmt.Errorf("create server: %v: %w", errors.Join(err, cleanup), region.ErrUnavailable)
	}
	if cleanup != nil {
		d.log.Warn("clean up after a failed create", "server", id, "err", cleanup)
	}
	d.log.Warn("the host could not make a server", "server", id, "err", err)
	rec.Volumes, rec.IP, rec.Network = nil, "", ""
	rec.Error = "The virtual machine could not be created: " + userMessage(err)
	dom.disk, dom.seed = "", ""
	doc, xerr := domainXML(dom)
	if xerr != nil {
		return region.Server{}, fmt.Errorf("create server: %w", xerr)
	}
	tomb, derr := conn.DomainDefineXML(doc)
	if derr != nil {
		return region.Server{}, d.fault("create server: record its failure", derr)
	}
	s, rerr := readServer(conn, tomb)
	if rerr != nil {
		return region.Server{}, d.fault("create server", rerr)
	}
	d.index.add(s.indexed())
	return d.observe(conn, s), nil
}

// resolved is what a spec names, found in the catalogue.
type resolved struct {
	network *region.Network
	flavor  *region.Flavor
	image   *region.Image
}

// resolve finds what the spec names in the catalogue (the image may be a snapshot of the
// spec's project instead), refusing what this region cannot run.
func (d *hostDriver) resolve(ctx context.Context, spec region.ServerSpec) (resolved, error) {
	cat, r := d.opts.Catalog, &d.opts.Region
	network, ok := cat.Network(spec.NetworkID)
	if spec.RegionID != r.ID || !ok || network.Region != r.ID {
		return resolved{}, fmt.Errorf("network %q is not in region %s: %w", spec.NetworkID, r.ID, region.ErrRefused)
	}
	flavor, ok := cat.Flavor(spec.FlavorID)
	if !ok {
		return resolved{}, fmt.Errorf("flavor %q does not exist: %w", spec.FlavorID, region.ErrRefused)
	}
	if why := r.RunsFlavor(flavor); why != "" {
		return resolved{}, fmt.Errorf("region %s cannot run flavor %s: %s: %w", r.ID, flavor.ID, why, region.ErrRefused)
	}
	if spec.Networking.PublicIP {
		return resolved{}, fmt.Errorf("region %s offers no public IP addresses: %w", r.ID, region.ErrRefused)
	}
	image, err := d.image(ctx, spec)
	if err != nil {
		return resolved{}, err
	}
	return resolved{network: network, flavor: flavor, image: image}, nil
}

// placement is what a server takes of its host.
type placement struct{ memKiB, cpus, diskBytes uint64 }

func placementOf(f *region.Flavor) placement {
	return placement{memKiB: uint64(f.MemoryGiB) << 20, cpus: uint64(f.CPUs), diskBytes: uint64(f.DiskGB) * 1_000_000_000}
}

// admit checks that the host has room for the flavor, counting the servers this process is
// making and has not defined yet, and counts this one among them until the returned function
// is called (once its domain is defined, or its create failed). Without that, creates at once
// would all see the same free room and overcommit the host.
func (d *hostDriver) admit(f *region.Flavor) (func(), error) {
	conn, err := d.host("host capacity")
	if err != nil {
		return nil, err
	}
	d.mu.RLock()
	pool := d.pool
	d.mu.RUnlock()
	d.placing.Lock()
	defer d.placing.Unlock()
	if _, err := d.capacity(conn, pool, f, d.pending); err != nil {
		return nil, err
	}
	p := placementOf(f)
	d.pending.memKiB += p.memKiB
	d.pending.cpus += p.cpus
	d.pending.diskBytes += p.diskBytes
	return func() {
		d.placing.Lock()
		defer d.placing.Unlock()
		d.pending.memKiB -= p.memKiB
		d.pending.cpus -= p.cpus
		d.pending.diskBytes -= p.diskBytes
	}, nil
}

// capacity checks that the host has room for the flavor beside what its domains hold and what
// is pending: its memory, its vCPUs shared at cpuAllocationRatio, and the flavor's disk free
// in the pool (overlays grow as guests write). It returns the memory free before the flavor's.
func (d *hostDriver) capacity(conn *golibvirt.Libvirt, pool golibvirt.StoragePool, f *region.Flavor, pending placement) (uint64, error) {
	memKiB, cpus, err := hostSize(conn)
	if err != nil {
		return 0, d.fault("host capacity", err)
	}
	held, err := allocated(conn)
	if err != nil {
		return 0, d.fault("host capacity", err)
	}
	usedKiB, usedCPUs := held.memKiB+pending.memKiB, held.cpus+pending.cpus
	need := placementOf(f)
	// Users see what is short for which flavor, in words that stay the same from one try to
	// the next; the host's own figures go to the log.
	switch {
	case usedKiB+need.memKiB+hostReservedKiB > memKiB:
		d.log.Info("no room on the host", "flavor", f.ID, "free_mib", free(memKiB, usedKiB+hostReservedKiB)>>10, "need_mib", need.memKiB>>10)
		return 0, fmt.Errorf("its host has not enough free memory for flavor %s: %w", f.ID, region.ErrNoCapacity)
	case usedCPUs+need.cpus > uint64(cpus)*cpuAllocationRatio:
		d.log.Info("no room on the host", "flavor", f.ID, "free_vcpus", free(uint64(cpus)*cpuAllocationRatio, usedCPUs), "need_vcpus", f.CPUs)
		return 0, fmt.Errorf("its host has not enough free vCPUs for flavor %s: %w", f.ID, region.ErrNoCapacity)
	}
	_, _, _, available, err := conn.StoragePoolGetInfo(pool)
	if err != nil {
		return 0, d.fault("pool capacity", err)
	}
	if need.diskBytes+pending.diskBytes > available {
		d.log.Info("no room in the pool", "flavor", f.ID, "free_bytes", free(available, pending.diskBytes), "need_bytes", need.diskBytes)
		return 0, fmt.Errorf("its storage has not enough free space for flavor %s: %w", f.ID, region.ErrNoCapacity)
	}
	return free(memKiB, usedKiB+hostReservedKiB), nil
}

// hostSize is the host's memory and CPUs. The memory is the whole machine's, from its memory
// statistics of all cells: NodeGetInfo's figure is that of NUMA node 0 only, which on a
// machine whose memory is plugged in as it runs can be a fraction of it, and changes.
func hostSize(conn *golibvirt.Libvirt) (memKiB uint64, cpus int32, err error) {
	_, _, cpus, _, _, _, _, _, err = conn.NodeGetInfo()
	if err != nil {
		return 0, 0, err
	}
	const allCells = -1
	_, n, err := conn.NodeGetMemoryStats(0, allCells, 0)
	if err != nil {
		return 0, 0, err
	}
	stats, _, err := conn.NodeGetMemoryStats(n, allCells, 0)
	if err != nil {
		return 0, 0, err
	}
	for _, s := range stats {
		if s.Field == "total" {
			return s.Value, cpus, nil
		}
	}
	return 0, 0, errors.New("the host's memory statistics have no total")
}

// allocated is the memory and vCPUs the host's domains hold: every domain that runs, and
// every server of ours that is defined but shut off. A stopped server keeps its room, as in
// Nova, so that starting it again never fails for want of it; a server that could not be
// made (a record of why, never started) holds nothing.
func allocated(conn *golibvirt.Libvirt) (placement, error) {
	doms, _, err := conn.ConnectListAllDomains(1, 0)
	if err != nil {
		return placement{}, err
	}
	var held placement
	for _, dom := range doms {
		state, maxMem, _, vcpus, _, err := conn.DomainGetInfo(dom)
		if err != nil {
			continue // gone meanwhile
		}
		if golibvirt.DomainState(state) == golibvirt.DomainShutoff {
			s, err := readServer(conn, dom)
			if err != nil || s.rec.Error != "" {
				continue // not ours, gone meanwhile, or a failed create's record
			}
		}
		held.memKiB += maxMem
		held.cpus += uint64(vcpus)
	}
	return held, nil
}

func free(total, used uint64) uint64 {
	if used > total {
		return 0
	}
	return total - used
}

// seed is what the guest learns at first boot: its instance id and hostname, the user data,
// and either the SSH certificate authority it trusts or the project's public key.
func (d *hostDriver) seed(ctx context.Context, spec region.ServerSpec) ([]byte, error) {
	s := nocloud.Seed{InstanceID: spec.Tags[region.InstanceTag], Hostname: spec.Name, UserData: spec.UserData}
	if s.InstanceID == "" {
		s.InstanceID = spec.Name
	}
	if id := spec.SSHCertificateAuthorityID; id != "" {
		ca, ok := d.opts.Catalog.SSHCertificateAuthority(id)
		if !ok {
			return nil, fmt.Errorf("SSH certificate authority %q does not exist: %w", id, region.ErrRefused)
		}
		s.TrustedUserCAKeys = []string{ca.PublicKey}
	} else {
		key, err := d.projectKey(ctx, spec.OrganizationID, spec.ProjectID)
		if err != nil {
			return nil, err
		}
		s.AuthorizedKeys = []string{strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key.PublicKey())))}
	}
	s.AuthorizedKeys = append(s.AuthorizedKeys, spec.SSHPublicKeys...)
	iso, err := s.ISO()
	if err != nil {
		return nil, fmt.Errorf("seed: %v: %w", err, region.ErrRefused)
	}
	return iso, nil
}

// build makes the server's disk and seed, defines its domain and starts it. The volumes it
// made are in dom.rec.Volumes, for whoever undoes a failure.
func (d *hostDriver) build(ctx context.Context, conn *golibvirt.Libvirt, pool golibvirt.StoragePool, dom domainSpec, seed []byte) (*server, error) {
	if dom.image.File != "" || dom.image.Volume != "" {
		base, err := d.baseVolume(ctx, conn, pool, dom.image)
		if err != nil {
			return nil, err
		}
		// A snapshot's disk may be a little larger than a flavor whose GB hold its whole GiB:
		// the guest's disk is never smaller than the disk its image was made of.
		_, baseBytes, _, err := conn.StorageVolGetInfo(base.vol)
		if err != nil {
			return nil, fmt.Errorf("image volume: %w", err)
		}
		disk, err := d.overlay(conn, pool, dom.name+".qcow2", base, max(uint64(dom.flavor.DiskGB)*1_000_000_000, baseBytes))
		if err != nil {
			return nil, err
		}
		dom.rec.Volumes = append(dom.rec.Volumes, dom.name+".qcow2")
		dom.disk = disk.path
	}
	vol, err := d.upload(conn, pool, dom.name+"-seed.iso", "raw", strings.NewReader(string(seed)), uint64(len(seed)))
	if err != nil {
		return nil, err
	}
	dom.rec.Volumes = append(dom.rec.Volumes, dom.name+"-seed.iso")
	seedVol, err := describe(conn, vol)
	if err != nil {
		return nil, err
	}
	dom.seed = seedVol.path
	logVol, err := d.upload(conn, pool, consoleLogName(dom.id), "raw", strings.NewReader(""), 0)
	if err != nil {
		return nil, err
	}
	dom.rec.Volumes = append(dom.rec.Volumes, consoleLogName(dom.id))
	consoleLog, err := describe(conn, logVol)
	if err != nil {
		return nil, err
	}
	dom.consoleLog = consoleLog.path
	if err := d.defineFilter(conn, dom.id, dom.rec.Spec.Networking); err != nil {
		return nil, err
	}
	doc, err := domainXML(dom)
	if err != nil {
		return nil, err
	}
	defined, err := conn.DomainDefineXML(doc)
	if err != nil {
		return nil, fmt.Errorf("define domain: %w", err)
	}
	if err := conn.DomainCreate(defined); err != nil {
		return nil, fmt.Errorf("start domain: %w", err)
	}
	s, err := readServer(conn, defined)
	if err != nil {
		return nil, err
	}
	d.index.add(s.indexed())
	return s, nil
}

// isHostError reports whether the host answered with an error of its own (it refused what it
// was asked), rather than not answering at all.
func isHostError(err error) bool {
	var lerr golibvirt.Error
	return errors.As(err, &lerr)
}

// userMessage says why a server could not be made without the host's internals (paths, QEMU's
// output), which go to the log: our own refusals in their words, a host's error by its kind.
func userMessage(err error) string {
	if errors.Is(err, region.ErrRefused) {
		return region.Reason(err, region.ErrRefused) + "."
	}
	var lerr golibvirt.Error
	if errors.As(err, &lerr) {
		switch golibvirt.ErrorNumber(lerr.Code) {
		case golibvirt.ErrNoStorageVol, golibvirt.ErrStorageVolExist:
			return "the host could not make its disk."
		}
		if strings.Contains(strings.ToLower(lerr.Message), "no space") {
			return "the host's storage is full."
		}
		return "the host refused it (" + strings.TrimPrefix(golibvirt.ErrorNumber(lerr.Code).String(), "Err") + ")."
	}
	return "the host failed."
}

// DeleteServer implements region.Client: the domain is stopped, its disk and seed deleted, its
// address reservation released, and the domain undefined last, so that a delete cut short
// is finished by the next one and leaves nothing behind.
func (d *hostDriver) DeleteServer(ctx context.Context, id string) error {
	conn, err := d.host("delete server")
	if err != nil {
		return err
	}
	s, err := d.lookup(conn, id)
	if errors.Is(err, region.ErrServerNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete server: %w", err)
	}
	if s.state != golibvirt.DomainShutoff {
		if err := conn.DomainDestroy(s.dom); err != nil && !isCode(err, golibvirt.ErrOperationInvalid) {
			return d.fault("delete server: power off", err)
		}
	}
	d.mu.RLock()
	pool := d.pool
	d.mu.RUnlock()
	volumes := s.rec.Volumes
	if filepath.Base(diskSource(&s.xml)) == overlayName(s.id) {
		// On a snapshot's overlay, which the snapshot made outside the pool: the pool learns
		// of it, and it goes too.
		if err := conn.StoragePoolRefresh(pool, 0); err != nil {
			return d.fault("delete server", err)
		}
		volumes = append(slices.Clone(volumes), overlayName(s.id))
	}
	if err := deleteVolumes(conn, pool, volumes); err != nil {
		return d.fault("delete server", err)
	}
	if err := release(conn, s.rec.Network, s.rec.MAC); err != nil {
		return d.fault("delete server", err)
	}
	// A saved state, snapshots' metadata or firmware variables would otherwise make the host
	// refuse, and the delete would fail for ever.
	flags := golibvirt.DomainUndefineManagedSave | golibvirt.DomainUndefineSnapshotsMetadata |
		golibvirt.DomainUndefineCheckpointsMetadata | golibvirt.DomainUndefineNvram
	if err := conn.DomainUndefineFlags(s.dom, flags); err != nil && !golibvirt.IsNotFound(err) {
		return d.fault("delete server: undefine", err)
	}
	// A domain started meanwhile (the end of a soft reboot, in this process or another) runs
	// on, transient, after its undefine: it goes too.
	if err := conn.DomainDestroy(s.dom); err != nil && !golibvirt.IsNotFound(err) && !isCode(err, golibvirt.ErrOperationInvalid) {
		return d.fault("delete server: power off", err)
	}
	// Only now: a filter a domain refers to cannot be undefined.
	if err := undefineFilter(conn, s.id); err != nil {
		return d.fault("delete server", err)
	}
	// The host's event would say so too; whichever comes first is reported, once.
	if gone, ok := d.index.remove(s.id); ok {
		d.watches.publish(region.Event{Kind: region.ServerDeleted, ServerID: gone.id, Scope: gone.scope, Tags: gone.tags})
	}
	return nil
}

// verb reads a server for a power verb, refusing one that could not be made.
func (d *hostDriver) verb(op, id string) (*golibvirt.Libvirt, *server, error) {
	conn, err := d.host(op)
	if err != nil {
		return nil, nil, err
	}
	s, err := d.lookup(conn, id)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	if s.rec.Error != "" {
		return nil, nil, fmt.Errorf("%s: the server could not be made: %w", op, region.ErrRefused)
	}
	return conn, s, nil
}

func running(s *server) bool {
	return s.state == golibvirt.DomainRunning || s.state == golibvirt.DomainBlocked
}

// stopped is a domain shut off, and not by a soft reboot that will start it again.
func stopped(s *server) bool {
	return s.state == golibvirt.DomainShutoff && s.rec.RebootBy.IsZero()
}

// StartServer implements region.Client.
func (d *hostDriver) StartServer(ctx context.Context, id string) (region.Server, error) {
	conn, s, err := d.verb("start server", id)
	if err != nil {
		return region.Server{}, err
	}
	if !stopped(s) {
		return region.Server{}, fmt.Errorf("start server: the server is not stopped: %w", region.ErrRefused)
	}
	if err := conn.DomainCreate(s.dom); err != nil {
		return region.Server{}, d.fault("start server", err)
	}
	if !s.rec.Built {
		d.building.add(s.id)
	}
	if !s.rec.StopBy.IsZero() || !s.rec.Built {
		buildBy := d.opts.Now().Add(d.buildTimeout).UTC()
		err := d.updateRecord(conn, s, func(r *record) {
			r.StopBy = time.Time{}
			if !r.Built {
				// A guest stopped before it was built gets its whole time again.
				r.BuildBy, r.Stalled = buildBy, ""
			}
		})
		if err != nil {
			return region.Server{}, d.fault("start server", err)
		}
	}
	srv := d.observe(conn, s)
	srv.State = region.ServerStarting
	return srv, nil
}

// StopServer implements region.Client: the guest is asked to power off (the ACPI power
// button) and is forced off when it has not within the region's stop timeout.
func (d *hostDriver) StopServer(ctx context.Context, id string) (region.Server, error) {
	conn, s, err := d.verb("stop server", id)
	if err != nil {
		return region.Server{}, err
	}
	if !running(s) {
		return region.Server{}, fmt.Errorf("stop server: the server is not running: %w", region.ErrRefused)
	}
	if !s.rec.StopBy.IsZero() {
		return region.Server{}, fmt.Errorf("stop server: the server is stopping already: %w", region.ErrRefused)
	}
	if !s.rec.RebootBy.IsZero() {
		return region.Server{}, fmt.Errorf("stop server: the server is rebooting: %w", region.ErrRefused)
	}
	if err := d.pressPowerButton(conn, s, &d.stopping, func(r *record, by time.Time) { r.StopBy = by }); err != nil {
		return region.Server{}, d.fault("stop server", err)
	}
	return d.observe(conn, s), nil
}

// pressPowerButton records in the server's record, with mark, when what the ACPI power button
// starts (a stop, a soft reboot) stops waiting for the guest, has this process watch it in
// marks, and presses the button.
func (d *hostDriver) pressPowerButton(conn *golibvirt.Libvirt, s *server, marks *idSet, mark func(r *record, by time.Time)) error {
	by := d.opts.Now().Add(d.stopTimeout).UTC()
	if err := d.updateRecord(conn, s, func(r *record) { mark(r, by) }); err != nil {
		return err
	}
	marks.add(s.id)
	return conn.DomainShutdownFlags(s.dom, golibvirt.DomainShutdownAcpiPowerBtn)
}

// eachMarked reads each server of marks whose record is still marked, and hands it to act;
// the rest (gone, or no longer marked) leave marks.
func (d *hostDriver) eachMarked(ctx context.Context, conn *golibvirt.Libvirt, marks *idSet, marked func(*record) bool, act func(*server)) {
	for _, id := range marks.list() {
		if ctx.Err() != nil {
			return
		}
		s, err := d.lookup(conn, id)
		if err != nil || !marked(&s.rec) {
			marks.remove(id)
			continue
		}
		act(s)
	}
}

// forceStops powers off every server whose graceful stop outlived the stop timeout, and
// forgets the stops that completed. Only servers marked stopping are read.
func (d *hostDriver) forceStops(ctx context.Context, conn *golibvirt.Libvirt) {
	d.eachMarked(ctx, conn, &d.stopping, func(r *record) bool { return !r.StopBy.IsZero() }, func(s *server) {
		switch {
		case s.state == golibvirt.DomainShutoff:
			if err := d.updateRecord(conn, s, func(r *record) { r.StopBy = time.Time{} }); err == nil {
				d.stopping.remove(s.id)
			}
		case d.opts.Now().After(s.rec.StopBy):
			d.log.InfoContext(ctx, "graceful stop timed out; forcing the server off", "server", s.id, "timeout", d.stopTimeout)
			if err := conn.DomainDestroy(s.dom); err != nil && !isCode(err, golibvirt.ErrOperationInvalid) {
				d.log.WarnContext(ctx, "force a server off", "server", s.id, "err", err)
			}
		}
	})
}

// watchBuilds looks for the lease of every server still building. The first process to see
// it records it, and the metadata's event tells every watch. A server that no longer runs
// (stopped while building) is looked at again when it is started.
func (d *hostDriver) watchBuilds(conn *golibvirt.Libvirt) {
	for _, id := range d.building.list() {
		s, err := d.lookup(conn, id)
		if err != nil {
			if errors.Is(err, region.ErrServerNotFound) {
				d.building.remove(id)
			}
			continue
		}
		// A domain defined but never started (its maker was cut short) is started here.
		if s.state == golibvirt.DomainShutoff && golibvirt.DomainShutoffReason(s.reason) == golibvirt.DomainShutoffUnknown &&
			!s.rec.Built && s.rec.Error == "" && s.rec.StopBy.IsZero() {
			if err := conn.DomainCreate(s.dom); err != nil {
				d.log.Warn("start a server that was never started", "server", id, "err", err)
			}
			continue
		}
		if d.observe(conn, s); s.rec.Built || s.rec.Error != "" || !running(s) {
			d.building.remove(id)
			continue
		}
		d.stall(conn, s)
	}
}

// stall marks a running guest that has not taken its address by its BuildBy: the server
// shows ERROR saying why. It stays watched, and becomes RUNNING if the guest takes its address
// after all. Its record's change is the event that tells the owner.
func (d *hostDriver) stall(conn *golibvirt.Libvirt, s *server) {
	if s.rec.Stalled != "" || s.rec.BuildBy.IsZero() || d.opts.Now().Before(s.rec.BuildBy) {
		return
	}
	msg := fmt.Sprintf("The guest did not take its network address within %s of starting: its image may not run a "+
		"DHCP client on its first network interface, or it did not boot. The server still runs, and is shown running if the guest takes its address.", d.buildTimeout)
	err := d.updateRecord(conn, s, func(r *record) {
		if !r.Built {
			r.Stalled = msg
		}
	})
	if err != nil {
		d.log.Warn("record that a server's build stalled", "server", s.id, "err", err)
		return
	}
	d.log.Warn("a server's guest did not take its address in time", "server", s.id, "timeout", d.buildTimeout)
}

// RebootServer implements region.Client. A soft reboot is the ACPI power button; once the
// guest has powered off it is started again, and a guest that has not within the region's
// stop timeout is reset, as a hard reboot is at once. A hard reboot during a soft one ends
// the wait.
func (d *hostDriver) RebootServer(ctx context.Context, id string, hard bool) (region.Server, error) {
	conn, s, err := d.verb("reboot server", id)
	if err != nil {
		return region.Server{}, err
	}
	switch {
	case !s.rec.RebootBy.IsZero() && hard:
		if err := d.endReboot(conn, s); err != nil {
			return region.Server{}, d.fault("reboot server", err)
		}
	case !s.rec.RebootBy.IsZero():
		return region.Server{}, fmt.Errorf("reboot server: the server is rebooting already: %w", region.ErrRefused)
	case !running(s) || !s.rec.StopBy.IsZero():
		return region.Server{}, fmt.Errorf("reboot server: the server is not running: %w", region.ErrRefused)
	case hard:
		if err := conn.DomainReset(s.dom, 0); err != nil {
			return region.Server{}, d.fault("reboot server", err)
		}
	default:
		if err := d.pressPowerButton(conn, s, &d.rebooting, func(r *record, by time.Time) { r.RebootBy = by }); err != nil {
			return region.Server{}, d.fault("reboot server", err)
		}
	}
	srv := d.observe(conn, s)
	srv.State = region.ServerRebooting
	return srv, nil
}

// finishReboots starts again every soft-rebooted server whose guest has powered off, resets
// those past their timeout, and forgets the reboots that ended. Only servers marked
// rebooting are read.
func (d *hostDriver) finishReboots(ctx context.Context, conn *golibvirt.Libvirt) {
	d.eachMarked(ctx, conn, &d.rebooting, func(r *record) bool { return !r.RebootBy.IsZero() }, func(s *server) {
		if s.state != golibvirt.DomainShutoff && !d.opts.Now().After(s.rec.RebootBy) {
			return
		}
		if s.state != golibvirt.DomainShutoff {
			d.log.InfoContext(ctx, "the guest did not power off for its reboot in time; resetting the server", "server", s.id, "timeout", d.stopTimeout)
		}
		if err := d.endReboot(conn, s); err != nil {
			d.log.WarnContext(ctx, "end a server's reboot", "server", s.id, "err", err)
			return
		}
		d.rebooting.remove(s.id)
	})
}

// endReboot ends a soft reboot: a guest that powered off is started, one still running is
// reset; then the record forgets the reboot. In that order, so that the server never shows
// STOPPED on its way back; and on the domain as the host has it now, under this process's
// record lock, so that a reboot another call ended meanwhile is not ended twice. Another
// process that ends it at the same moment makes the host refuse the second start, which is
// no failure; a process that dies between the two leaves the reboot to the next, which resets
// the guest once more at the timeout.
func (d *hostDriver) endReboot(conn *golibvirt.Libvirt, s *server) error {
	d.records.Lock()
	defer d.records.Unlock()
	fresh, err := readServer(conn, s.dom)
	if err != nil {
		return err
	}
	if fresh.rec.RebootBy.IsZero() {
		*s = *fresh
		return nil
	}
	if fresh.state == golibvirt.DomainShutoff {
		err = conn.DomainCreate(fresh.dom)
	} else {
		err = conn.DomainReset(fresh.dom, 0)
	}
	if err != nil && !isCode(err, golibvirt.ErrOperationInvalid) {
		return err
	}
	if fresh, err = readServer(conn, s.dom); err != nil {
		return err
	}
	fresh.rec.RebootBy = time.Time{}
	if err := writeRecord(conn, fresh); err != nil {
		return err
	}
	*s = *fresh
	return nil
}

// UpdateNetworking implements region.Client. The server keeps its domain, MAC and address;
// security groups and allowed source addresses are recorded but not yet enforced.
func (d *hostDriver) UpdateNetworking(ctx context.Context, id string, n region.ServerNetworking) (region.Server, error) {
	conn, s, err := d.verb("update networking", id)
	if err != nil {
		return region.Server{}, err
	}
	if n.PublicIP {
		return region.Server{}, fmt.Errorf("update networking: region %s offers no public IP addresses: %w", d.opts.Region.ID, region.ErrRefused)
	}
	if err := d.defineFilter(conn, s.id, n); err != nil {
		return region.Server{}, d.fault("update networking", err)
	}
	if err := d.updateRecord(conn, s, func(r *record) { r.Spec.Networking = n }); err != nil {
		return region.Server{}, d.fault("update networking", err)
	}
	return d.observe(conn, s), nil
}

// SSHKey implements region.Client: the project's key pair, whose public half every server of
// the project without an SSH certificate authority authorizes.
func (d *hostDriver) SSHKey(ctx context.Context, id string) (region.SSHKey, error) {
	_, s, err := d.verb("ssh key", id)
	if err != nil {
		return region.SSHKey{}, err
	}
	spec := s.rec.Spec
	if spec.SSHCertificateAuthorityID != "" {
		return region.SSHKey{}, fmt.Errorf("ssh key: the server accepts certificates of SSH certificate authority %s, not the project key pair: %w", spec.SSHCertificateAuthorityID, region.ErrRefused)
	}
	key, err := d.projectKey(ctx, spec.OrganizationID, spec.ProjectID)
	if err != nil {
		return region.SSHKey{}, err
	}
	return region.SSHKey{PrivateKey: key.pem}, nil
}

// projectKeyPair is a project's SSH key pair.
type projectKeyPair struct {
	// pem is the private key in OpenSSH's form, as stored: the form holds a random check
	// number, so the stored text, not a fresh encoding, is what every caller gets.
	pem    string
	signer ssh.Signer
}

func (k projectKeyPair) PublicKey() ssh.PublicKey { return k.signer.PublicKey() }

// projectKey returns the project's key pair, made on first use. It lives in Redis, under the
// region's hash tag, so that every process and every server of the project shares it.
func (d *hostDriver) projectKey(ctx context.Context, org, project string) (projectKeyPair, error) {
	key := sshKeyKey(d.opts.Region.ID, org, project)
	stored, err := d.opts.Redis.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		_, fresh, gerr := ed25519.GenerateKey(rand.Reader)
		if gerr != nil {
			return projectKeyPair{}, fmt.Errorf("ssh key: %w", gerr)
		}
		block, merr := ssh.MarshalPrivateKey(fresh, org+"/"+project)
		if merr != nil {
			return projectKeyPair{}, fmt.Errorf("ssh key: %w", merr)
		}
		// SETNX keeps the first key of the project when two requests race.
		if err := d.opts.Redis.SetNX(ctx, key, pem.EncodeToMemory(block), 0).Err(); err != nil {
			return projectKeyPair{}, fmt.Errorf("ssh key: %v: %w", err, region.ErrUnavailable)
		}
		stored, err = d.opts.Redis.Get(ctx, key).Result()
	}
	if err != nil {
		return projectKeyPair{}, fmt.Errorf("ssh key: %v: %w", err, region.ErrUnavailable)
	}
	signer, err := ssh.ParsePrivateKey([]byte(stored))
	if err != nil {
		return projectKeyPair{}, fmt.Errorf("ssh key of project %s/%s: %w", org, project, err)
	}
	return projectKeyPair{pem: stored, signer: signer}, nil
}

// randomMAC is a locally administered unicast address in QEMU's 52:54:00 range.
func randomMAC() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", b[0], b[1], b[2])
}
