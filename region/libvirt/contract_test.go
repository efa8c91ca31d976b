package libvirt_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/libvirt"
	"github.com/computeql/computeql/region/regiontest"
	"github.com/computeql/computeql/sshtest"
	"github.com/computeql/computeql/virttest"
)

// ImagesEnv names the directory `make images` wrote the guest images to; make virt-test sets
// it. Without it the tests that boot guests cannot run: they skip, or fail under CI.
const ImagesEnv = "COMPUTEQL_IMAGES_DIR"

// busybox returns the busybox guest's kernel and initramfs.
func busybox(t testing.TB) (kernel, initrd string) {
	dir := os.Getenv(ImagesEnv)
	kernel, initrd = filepath.Join(dir, "busybox", "vmlinuz"), filepath.Join(dir, "busybox", "initrd.img")
	_, kerr := os.Stat(kernel)
	_, ierr := os.Stat(initrd)
	if dir == "" || kerr != nil || ierr != nil {
		msg := fmt.Sprintf("no busybox guest image in $%s=%q: run make virt-test, which builds it", ImagesEnv, dir)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return kernel, initrd
}

// labCatalog is a libvirt region on the host with one network, a tiny flavor, the busybox
// guest and an SSH certificate authority for the project.
// more is what a test adds to the lab catalogue: JSON objects of flavors and images, and the
// region's buildTimeout and stopTimeout.
type more struct {
	flavors, images           []string
	buildTimeout, stopTimeout string
	// hosts, when given, are the region's hosts (rack1, rack2, …) instead of the one host.
	hosts []*virttest.Host
	// uri, when given, reaches the one host instead of its own URI.
	uri string
}

func labCatalog(t testing.TB, host *virttest.Host, kernel, initrd string, add ...more) *region.Catalog {
	var m more
	if len(add) > 0 {
		m = add[0]
	}
	if m.buildTimeout == "" {
		m.buildTimeout = "10m"
	}
	if m.stopTimeout == "" {
		m.stopTimeout = "20s"
	}
	doc := fmt.Sprintf(`{
  "regions": [{"id": "lab", "name": "Lab", "driver": "libvirt",
    "libvirt": {%s, "accel": "tcg", "stopTimeout": %q, "buildTimeout": %q}}],
  "organizations": [{"id": "acme", "name": "Acme", "projects": [{"id": "web", "name": "Web"}]}],
  "networks": [{"id": "lab-web", "name": "web", "organizationId": "acme", "projectId": "web", "region": "lab", "prefix": "10.91.0.0/24"}],
  "securityGroups": [],
  "sshCertificateAuthorities": [{"id": "ca-web", "name": "web CA", "organizationId": "acme", "projectId": "web", "publicKey": %q}],
  "flavors": [{"id": "tiny", "name": "tiny", "cpus": 1, "memoryGiB": 1, "diskGB": 1, "architecture": "x86_64", "regions": ["lab"]},
    {"id": "tiny2", "name": "tiny2", "cpus": 2, "memoryGiB": 1, "diskGB": 2, "architecture": "x86_64", "regions": ["lab"]},
    {"id": "huge", "name": "huge", "cpus": 1, "memoryGiB": 4096, "diskGB": 1, "architecture": "x86_64", "regions": ["lab"]}%s],
  "images": [{"id": "busybox", "name": "busybox", "architecture": "x86_64", "sizeGiB": 1, "virtualization": "virtualized",
    "state": "ready", "regions": ["lab"], "kernel": %q, "initrd": %q, "cmdline": "console=ttyS0"}%s]
}`, hostsJSON(host, m.uri, m.hosts), m.stopTimeout, m.buildTimeout, sshtest.PublicKey(t), extra(m.flavors),
		kernel, initrd, extra(m.images))
	cat, err := region.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

// hostsJSON is the libvirt settings that name the region's hosts: host by uri (its own, or
// the one given), or hosts as rack1, rack2, …, each with its pool in its own directory.
func hostsJSON(host *virttest.Host, uri string, hosts []*virttest.Host) string {
	if len(hosts) == 0 {
		if uri == "" {
			uri = host.URI
		}
		return fmt.Sprintf(`"uri": %q, "poolPath": %q`, uri, filepath.Join(host.Dir, "pool"))
	}
	list := make([]string, len(hosts))
	for i, h := range hosts {
		list[i] = fmt.Sprintf(`{"name": "rack%d", "uri": %q, "poolPath": %q}`, i+1, h.URI, filepath.Join(h.Dir, "pool"))
	}
	return `"hosts": [` + strings.Join(list, ", ") + `]`
}

// extra joins JSON array elements to follow others.
func extra(elements []string) string {
	if len(elements) == 0 {
		return ""
	}
	return ", " + strings.Join(elements, ", ")
}

// startDriver runs a driver of the lab region, on the test's Redis emptied, until the test
// ends and waits until it is connected.
func startDriver(t testing.TB, cat *region.Catalog) *libvirt.Driver {
	return runDriver(t, cat, redisServer.Client(t))
}

// runDriver is startDriver on a Redis client as it is.
func runDriver(t testing.TB, cat *region.Catalog, rdb redis.UniversalClient) *libvirt.Driver {
	return runDriverWith(t, cat, rdb, func(*libvirt.Options) {})
}

// runDriverWith is runDriver with options edited.
func runDriverWith(t testing.TB, cat *region.Catalog, rdb redis.UniversalClient, edit func(*libvirt.Options)) *libvirt.Driver {
	lab, _ := cat.Region("lab")
	opts := libvirt.Options{Region: *lab, Catalog: cat, Redis: rdb, Logger: slog.New(slog.DiscardHandler)}
	edit(&opts)
	d, err := libvirt.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	eventually.Holds(t, 30*time.Second, d.Connected, "driver connected to %s", lab.Libvirt.URI)
	return d
}

var redisServer *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &redisServer) }

// TestLibvirtContract runs the region contract against real QEMU guests on a region of two
// private libvirtd hosts, so that every call is routed to the host that holds its server, the
// watch merges both hosts' events, and a snapshot's servers go to its host. Its servers boot
// busybox with a disk beside it (busybox-disk), so that they have a disk to snapshot. A region
// of one host is the same code with nothing to place or route; the other tests here run on
// one.
func TestLibvirtContract(t *testing.T) {
	kernel, initrd := busybox(t)
	racks := []*virttest.Host{virttest.Start(t, virttest.Options{}), virttest.Start(t, virttest.Options{})}
	cat := labCatalog(t, racks[0], kernel, initrd, more{hosts: racks, images: []string{diskImage(t, kernel, initrd)}})
	d := startDriver(t, cat)
	// A bound for a failure, not a timed assertion: under software emulation on two loaded
	// cores a guest once took longer than two minutes to leave BUILDING in CI.
	regiontest.Run(t, regiontest.Harness{Client: d, Catalog: cat, Timeout: 4 * time.Minute, ResizeFlavor: "tiny2",
		Spec: func(name string) region.ServerSpec {
			spec := labSpec(name)
			spec.ImageID = "busybox-disk"
			return spec
		},
		Capabilities: regiontest.Capabilities{Snapshots: true}})
}

// diskImage is the catalogue entry of image busybox-disk: the busybox guest booted with a disk
// (a raw file of a few MiB that the test writes), which the guest does not use.
func diskImage(t testing.TB, kernel, initrd string) string {
	path := filepath.Join(t.TempDir(), "disk.raw")
	disk := make([]byte, 4<<20)
	copy(disk, "computeql busybox-disk\n")
	if err := os.WriteFile(path, disk, 0o644); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`{"id": "busybox-disk", "name": "busybox-disk", "architecture": "x86_64", "sizeGiB": 1, "virtualization": "virtualized",
    "state": "ready", "regions": ["lab"], "file": %q, "kernel": %q, "initrd": %q, "cmdline": "console=ttyS0"}`, path, kernel, initrd)
}

var specs atomic.Int64

// labSpec is a busybox server of acme/web on the lab network, with an instance tag of its own.
func labSpec(name string) region.ServerSpec {
	return region.ServerSpec{
		Scope: region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: "lab", NetworkID: "lab-web"},
		Name:  name, FlavorID: "tiny", ImageID: "busybox",
		Tags: map[string]string{region.InstanceTag: fmt.Sprintf("i-%d", specs.Add(1))},
	}
}
