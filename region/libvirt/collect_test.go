package libvirt

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/virttest"
)

func TestServerOfVolume(t *testing.T) {
	id := uuid.NewString()
	for name, want := range map[string]string{
		namePrefix + id + ".qcow2":      id,
		namePrefix + id + "-seed.iso":   id,
		namePrefix + "image-busybox":    "",
		namePrefix + "not-a-uuid.qcow2": "",
		"someone-else.qcow2":            "",
	} {
		got, ok := serverOfVolume(name)
		if got != want || ok != (want != "") {
			t.Errorf("serverOfVolume(%q) = %q, %v; want %q", name, got, ok, want)
		}
	}
}

// collectingDriver is a driver of region "lab", with one network (labnet, 10.77.0.0/24), on a
// private libvirtd, whose clock the test moves with the returned pointer.
func collectingDriver(t *testing.T) (*hostDriver, *golibvirt.Libvirt, *time.Time) {
	t.Helper()
	host := virttest.Start(t, virttest.Options{})
	rs, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	now := new(time.Time)
	*now = time.Now()
	// Only the test's goroutine calls what reads the clock: the session's collection pass
	// is far off.
	d, conn := labDriver(t, labCatalogJSON(host, ""), rs.Addr, slog.New(slog.DiscardHandler), func() time.Time { return *now })
	return d, conn, now
}

// labCatalogJSON is a catalogue of region "lab" on the host, with one network (labnet,
// 10.77.0.0/24) and the images (a JSON array's elements).
func labCatalogJSON(host *virttest.Host, images string) string {
	return fmt.Sprintf(`{"regions": [{"id": "lab", "name": "Lab", "driver": "libvirt",
		"libvirt": {"uri": %q, "poolPath": %q, "accel": "tcg"}}], "organizations": [{"id": "o", "name": "O", "projects": [{"id": "p", "name": "P"}]}],
		"networks": [{"id": "labnet", "name": "Lab net", "region": "lab", "organizationId": "o", "projectId": "p", "prefix": "10.77.0.0/24"}],
		"securityGroups": [], "sshCertificateAuthorities": [], "flavors": [], "images": [%s]}`, host.URI, filepath.Join(host.Dir, "pool"), images)
}

// labDriver runs a driver of region "lab" of the catalogue, whose one host it returns, until
// the test ends, and returns it once connected, with its connection.
func labDriver(t *testing.T, doc, redisAddr string, log *slog.Logger, now func() time.Time) (*hostDriver, *golibvirt.Libvirt) {
	t.Helper()
	return labDriverWith(t, doc, redisAddr, func(o *Options) { o.Logger, o.Now = log, now })
}

// labDriverWith is labDriver with its options edited.
func labDriverWith(t *testing.T, doc, redisAddr string, edit func(*Options)) (*hostDriver, *golibvirt.Libvirt) {
	t.Helper()
	cat, err := region.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	lab, _ := cat.Region("lab")
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = rdb.Close() })
	opts := Options{Region: *lab, Catalog: cat, Redis: rdb}
	edit(&opts)
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually.Holds(t, 30*time.Second, r.Connected, "driver connected")
	d := r.hosts[0]
	conn, err := d.host("test")
	if err != nil {
		t.Fatal(err)
	}
	return d, conn
}

// A server's volume without its domain (a create cut short) is deleted once it is old
// enough; base images and young volumes are kept.
func TestLibvirtCollectsOrphanedVolumes(t *testing.T) {
	d, conn, now := collectingDriver(t)
	orphan := namePrefix + uuid.NewString() + ".qcow2"
	base := namePrefix + "image-busybox"
	for _, name := range []string{orphan, base} {
		if _, err := d.upload(conn, d.pool, name, "raw", strings.NewReader("disk"), 4); err != nil {
			t.Fatal(err)
		}
	}
	volumes := func() []string {
		vols, _, err := conn.StoragePoolListAllVolumes(d.pool, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, v := range vols {
			names = append(names, v.Name)
		}
		return names
	}
	if n, err := d.collectVolumes(conn, d.pool); n != 0 || err != nil {
		t.Fatalf("collected %d (%v) volumes made a moment ago, want none: a create may be under way", n, err)
	}
	*now = now.Add(orphanAge + time.Minute)
	if n, err := d.collectVolumes(conn, d.pool); n != 1 || err != nil {
		t.Fatalf("collected %d volumes (%v), want the orphan's one", n, err)
	}
	if got := volumes(); slices.Contains(got, orphan) || !slices.Contains(got, base) {
		t.Errorf("volumes left: %v, want the base image's and not the orphan's", got)
	}
}

// A DHCP reservation no domain holds (a process that died between reserving and defining) is
// released once it was seen unowned for orphanAge; one a domain holds is kept for ever.
func TestLibvirtCollectsOrphanedReservations(t *testing.T) {
	d, conn, now := collectingDriver(t)
	network, _ := d.opts.Catalog.Network("labnet")
	net, err := d.ensureNetwork(conn, network)
	if err != nil {
		t.Fatal(err)
	}
	orphan, owned := randomMAC(), randomMAC()
	var orphanIP string
	for _, mac := range []string{orphan, owned} {
		ip, err := d.reserve(conn, net, network, mac)
		if err != nil {
			t.Fatal(err)
		}
		if mac == orphan {
			orphanIP = ip
		}
	}
	// A domain that holds its reservation, defined and never started.
	dom := libvirtxml.Domain{Type: "qemu", Name: "holder", Memory: &libvirtxml.DomainMemory{Value: 64, Unit: "MiB"},
		OS: &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
		Devices: &libvirtxml.DomainDeviceList{Interfaces: []libvirtxml.DomainInterface{{
			MAC:    &libvirtxml.DomainInterfaceMAC{Address: strings.ToUpper(owned)},
			Source: &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: net.Name}},
		}}}}
	doc, err := dom.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.DomainDefineXML(doc); err != nil {
		t.Fatal(err)
	}
	held := func() []string {
		hosts, err := reservations(conn, net)
		if err != nil {
			t.Fatal(err)
		}
		var macs []string
		for _, h := range hosts {
			macs = append(macs, strings.ToLower(h.MAC))
		}
		slices.Sort(macs)
		return macs
	}
	both := slices.Sorted(slices.Values([]string{orphan, owned}))

	for i, pass := range []struct {
		after time.Duration
		want  []string
	}{
		{0, both},                       // first seen unowned: a create may be under way
		{orphanAge - time.Minute, both}, // not unowned for long enough yet
		{2 * time.Minute, []string{owned}},
		{orphanAge * 10, []string{owned}}, // the owned one, never
	} {
		*now = now.Add(pass.after)
		if _, err := d.collectReservations(conn); err != nil {
			t.Fatalf("pass %d: %v", i, err)
		}
		if got := held(); !slices.Equal(got, pass.want) {
			t.Fatalf("pass %d (+%s): reservations of %v, want %v", i, pass.after, got, pass.want)
		}
	}
	// The released address is free again.
	mac := randomMAC()
	if ip, err := d.reserve(conn, net, network, mac); err != nil || ip != orphanIP {
		t.Errorf("next reservation got %s (%v), want the released %s", ip, err, orphanIP)
	}
}

// Two processes making a server on a network that does not exist yet both define it at once:
// both go on with the one network the host kept.
func TestLibvirtNetworkDefinedAtOnceByTwoProcesses(t *testing.T) {
	host := virttest.Start(t, virttest.Options{})
	rs, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	doc, quiet := labCatalogJSON(host, ""), slog.New(slog.DiscardHandler)
	a, connA := labDriver(t, doc, rs.Addr, quiet, time.Now)
	b, connB := labDriver(t, doc, rs.Addr, quiet, time.Now)
	network, _ := a.opts.Catalog.Network("labnet")
	var wg sync.WaitGroup
	uuids := make([][16]byte, 2)
	for i, p := range []struct {
		d    *hostDriver
		conn *golibvirt.Libvirt
	}{{a, connA}, {b, connB}} {
		wg.Go(func() {
			net, err := p.d.ensureNetwork(p.conn, network)
			if err != nil {
				t.Errorf("process %d: %v", i, err)
				return
			}
			uuids[i] = net.UUID
		})
	}
	wg.Wait()
	if uuids[0] != uuids[1] {
		t.Errorf("the processes went on with networks %x and %x, want the same one", uuids[0], uuids[1])
	}
	nets, _, err := connA.ConnectListAllNetworks(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(nets) != 1 || nets[0].Name != networkName(network) {
		t.Errorf("networks on the host: %+v, want %s alone", nets, networkName(network))
	}
}

// Changes of different fields of a server's record, each made from a copy read before the
// other's write (a stop's deadline from a verb, the moment the guest took its address from
// the build watch), never undo each other.
func TestLibvirtRecordChangesDoNotUndoEachOther(t *testing.T) {
	d, conn, _ := collectingDriver(t)
	id := uuid.NewString()
	rec := &record{CreatedAt: time.Now().UTC(), MAC: randomMAC()}
	doc, err := domainXML(domainSpec{name: namePrefix + id, id: id, domainType: "qemu",
		flavor: &region.Flavor{ID: "f", CPUs: 1, MemoryGiB: 1}, image: &region.Image{ID: "i"}, rec: rec})
	if err != nil {
		t.Fatal(err)
	}
	dom, err := conn.DomainDefineXML(doc)
	if err != nil {
		t.Fatal(err)
	}
	read := func() *server {
		s, err := readServer(conn, dom)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	stale1, stale2 := read(), read()
	stopBy := time.Now().Add(time.Minute).UTC().Truncate(time.Second)
	if err := d.updateRecord(conn, stale1, func(r *record) { r.Built = true }); err != nil {
		t.Fatal(err)
	}
	if err := d.updateRecord(conn, stale2, func(r *record) { r.StopBy = stopBy }); err != nil {
		t.Fatal(err)
	}
	got := read().rec
	if !got.Built || !got.StopBy.Equal(stopBy) {
		t.Errorf("record after two changes: built %v, stopBy %s; want built and %s", got.Built, got.StopBy, stopBy)
	}
	if !stale2.rec.Built {
		t.Errorf("the writer's copy was left stale: %+v", stale2.rec)
	}
}

// A server's network filter without its domain is undefined once seen unowned for orphanAge;
// one whose domain exists is kept.
func TestLibvirtCollectsOrphanedFilters(t *testing.T) {
	d, conn, now := collectingDriver(t)
	orphan, owned := uuid.NewString(), uuid.NewString()
	for _, id := range []string{orphan, owned} {
		if err := d.defineFilter(conn, id, region.ServerNetworking{}); err != nil {
			t.Fatal(err)
		}
	}
	doc, err := domainXML(domainSpec{name: namePrefix + owned, id: owned, domainType: "qemu",
		flavor: &region.Flavor{ID: "f", CPUs: 1, MemoryGiB: 1}, image: &region.Image{ID: "i"}, rec: &record{MAC: randomMAC()}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.DomainDefineXML(doc); err != nil {
		t.Fatal(err)
	}
	defined := func() []string {
		fs, _, err := conn.ConnectListAllNwfilters(1, 0)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, f := range fs {
			names = append(names, f.Name)
		}
		slices.Sort(names)
		return names
	}
	both := slices.Sorted(slices.Values([]string{filterName(orphan), filterName(owned)}))
	for i, pass := range []struct {
		after time.Duration
		want  []string
	}{
		{0, both},
		{orphanAge - time.Minute, both},
		{2 * time.Minute, []string{filterName(owned)}},
		{orphanAge * 10, []string{filterName(owned)}},
	} {
		*now = now.Add(pass.after)
		if _, err := d.collectFilters(conn); err != nil {
			t.Fatalf("pass %d: %v", i, err)
		}
		if got := defined(); !slices.Equal(got, pass.want) {
			t.Fatalf("pass %d (+%s): filters %v, want %v", i, pass.after, got, pass.want)
		}
	}
}

// A host that accepts the connection and never answers (a libvirtd still starting, or hung)
// does not hold the driver: past ConnectTimeout it cuts the connection and dials again.
func TestLibvirtHostThatNeverAnswersIsDialledAgain(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "libvirt-sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	cat, err := region.Parse([]byte(fmt.Sprintf(`{"regions": [{"id": "lab", "name": "Lab", "driver": "libvirt",
		"libvirt": {"uri": "qemu:///system?socket=%s", "accel": "tcg"}}], "organizations": [], "networks": [],
		"securityGroups": [], "sshCertificateAuthorities": [], "flavors": [], "images": []}`, sock)))
	if err != nil {
		t.Fatal(err)
	}
	lab, _ := cat.Region("lab")
	rs, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	d, err := New(Options{Region: *lab, Catalog: cat, Redis: redis.NewClient(&redis.Options{Addr: rs.Addr}),
		Logger: slog.New(slog.DiscardHandler), Retry: 10 * time.Millisecond, ConnectTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()

	first := <-accepted
	// The driver's handshake arrives and is never answered; the driver must cut it.
	if _, err := io.Copy(io.Discard, first); err != nil {
		t.Fatalf("reading the unanswered connection: %v", err)
	}
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(30 * time.Second):
		t.Fatal("the driver never dialled again after cutting a connection that was not answered")
	}
	if d.Connected() {
		t.Error("the driver says it is connected to a host that never answered")
	}
}
