package openstack_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/quotasets"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	netquotas "github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/quotas"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/rules"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/openstacktest"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	ostack "github.com/computeql/computeql/region/openstack"
	"github.com/computeql/computeql/region/regiontest"
	"github.com/computeql/computeql/sshtest"
)

var redisServer *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &redisServer) }

// lab is a control plane with what the driver's tests need beside the seed: a second, larger
// flavor to resize to, and a security group of the cloud's that lets SSH in.
type lab struct {
	cloud            *openstacktest.Cloud
	compute, network *gophercloud.ServiceClient
	bigFlavorID      string
	sshGroupID       string
}

func startLab(t *testing.T) *lab {
	t.Helper()
	c := openstacktest.Start(t)
	pc, eo, err := c.Client(t.Context())
	if err != nil {
		t.Fatalf("authenticate through clouds.yaml: %v", err)
	}
	compute, err := openstack.NewComputeV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}
	network, err := openstack.NewNetworkV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}
	disk := 2
	big, err := flavors.Create(t.Context(), compute, flavors.CreateOpts{Name: "computeql.small", VCPUs: 2, RAM: 128, Disk: &disk}).Extract()
	if err != nil {
		t.Fatalf("create a flavor to resize to: %v", err)
	}
	ssh, err := groups.Create(t.Context(), network, groups.CreateOpts{Name: "computeql-test-ssh"}).Extract()
	if err != nil {
		t.Fatalf("create a security group: %v", err)
	}
	_, err = rules.Create(t.Context(), network, rules.CreateOpts{Direction: rules.DirIngress, EtherType: rules.EtherType4, SecGroupID: ssh.ID,
		Protocol: rules.ProtocolTCP, PortRangeMin: 22, PortRangeMax: 22}).Extract()
	if err != nil {
		t.Fatalf("create a security group rule: %v", err)
	}
	return &lab{cloud: c, compute: compute, network: network, bigFlavorID: big.ID, sshGroupID: ssh.ID}
}

// catalog is an OpenStack region "os" of the lab's cloud: acme/web's network is the seeded
// one, flavor tiny the seeded flavor and small the larger one, image cirros the seeded image,
// and the region's external network the one external names ("" for none).
func (l *lab) catalog(t *testing.T, external string) *region.Catalog {
	t.Helper()
	c := l.cloud
	doc := fmt.Sprintf(`{
  "regions": [{"id": "os", "name": "OpenStack", "driver": "openstack",
    "openstack": {"cloud": %q, "pollInterval": "250ms", "externalNetwork": %q}}],
  "organizations": [{"id": "acme", "name": "Acme", "projects": [{"id": "web", "name": "Web"}]}],
  "networks": [{"id": "os-web", "name": "web", "organizationId": "acme", "projectId": "web", "region": "os",
    "prefix": "192.0.2.0/24", "openstack": {"id": %q}}],
  "securityGroups": [{"id": "os-ssh", "name": "ssh", "networkId": "os-web",
    "rules": [{"direction": "ingress", "protocol": "tcp", "portMin": 22, "portMax": 22}], "openstack": {"id": %q}}],
  "sshCertificateAuthorities": [{"id": "ca-web", "name": "web CA", "organizationId": "acme", "projectId": "web", "publicKey": %q}],
  "flavors": [{"id": "tiny", "name": "tiny", "cpus": 1, "memoryGiB": 1, "diskGB": 1, "architecture": "x86_64", "regions": ["os"],
      "openstack": {"id": %q}},
    {"id": "small", "name": "small", "cpus": 2, "memoryGiB": 1, "diskGB": 2, "architecture": "x86_64", "regions": ["os"],
      "openstack": {"id": %q}}],
  "images": [{"id": "cirros", "name": "cirros", "architecture": "x86_64", "sizeGiB": 1, "virtualization": "virtualized",
    "state": "ready", "regions": ["os"], "openstack": {"id": %q}}]
}`, openstacktest.CloudName, external, c.NetworkID, l.sshGroupID, sshtest.PublicKey(t), c.FlavorID, l.bigFlavorID, c.ImageID)
	cat, err := region.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

// driver is a driver of region "os" of the catalogue, on the test's Redis.
func (l *lab) driver(t *testing.T, cat *region.Catalog) *ostack.Driver {
	t.Helper()
	r, _ := cat.Region("os")
	d, err := ostack.New(ostack.Options{Region: *r, Catalog: cat, Redis: redisServer.Client(t), CloudsFile: l.cloud.CloudsYAML,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

var specs atomic.Int64

// spec is a tiny cirros server of acme/web on the network, with an instance tag of its own.
func spec(name string) region.ServerSpec {
	return region.ServerSpec{
		Scope: region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: "os", NetworkID: "os-web"},
		Name:  name, FlavorID: "tiny", ImageID: "cirros",
		Tags: map[string]string{region.InstanceTag: fmt.Sprintf("i-%d-%d", time.Now().UnixNano(), specs.Add(1)), "made/by": "contract"},
	}
}

// TestOpenStackDriver brings a control plane up once and runs the region contract against Nova
// (with its fake virt driver), Neutron and Glance, then what the contract does not say of this
// driver: its security groups and quota.
func TestOpenStackDriver(t *testing.T) {
	l := startLab(t)
	cat := l.catalog(t, l.cloud.ExternalNetworkID)
	d := l.driver(t, cat)
	t.Run("contract", func(t *testing.T) {
		regiontest.Run(t, regiontest.Harness{
			Client: d, Catalog: cat, Spec: spec, ResizeFlavor: "small", Timeout: time.Minute,
			Capabilities: regiontest.Capabilities{NoConsole: true, PublicIPs: true, Snapshots: true},
		})
	})
	t.Run("security groups", func(t *testing.T) { l.securityGroups(t, d) })
	t.Run("floating IPs", func(t *testing.T) { l.floatingIPs(t, l.driver(t, l.catalog(t, "computeql-public"))) })
	t.Run("no external network", func(t *testing.T) { l.noExternalNetwork(t, l.driver(t, l.catalog(t, ""))) })
	t.Run("floating IP quota", func(t *testing.T) { l.floatingIPQuota(t, d) })
	t.Run("servers of the region only", func(t *testing.T) { l.regionOnly(t, d) })
	t.Run("snapshot of a server made from a snapshot", func(t *testing.T) { snapshotOfSnapshot(t, d) })
	t.Run("catalogue checked against the cloud", func(t *testing.T) { l.checkCatalogue(t) })
	t.Run("user data and SSH keys", func(t *testing.T) { l.userData(t, d, cat) })
	t.Run("deleted while it builds", func(t *testing.T) { deletedWhileBuilding(t, d) })
	t.Run("quota", func(t *testing.T) { l.quota(t, d) })
}

// deletedWhileBuilding: a server deleted as soon as the watch has seen it, which is mostly
// while it builds and before it reaches a compute cell (when Nova deletes it without moving its
// updated time, so that changes-since never lists the deletion), is reported deleted all the
// same.
func deletedWhileBuilding(t *testing.T, d *ostack.Driver) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var id atomic.Value
	id.Store("")
	kinds := make(chan region.EventKind, 64)
	ended := make(chan error, 1)
	go func() {
		ended <- d.Watch(ctx, "", func(ev region.Event) error {
			if ev.ServerID == id.Load() {
				select {
				case kinds <- ev.Kind:
				case <-ctx.Done():
				}
			}
			return nil
		})
	}()
	srv, err := d.CreateServer(t.Context(), spec("short-lived"))
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	id.Store(srv.ID)
	await := func(what string, want func(region.EventKind) bool) {
		t.Helper()
		deadline := time.After(time.Minute)
		for {
			select {
			case k := <-kinds:
				if want(k) {
					return
				}
			case err := <-ended:
				t.Fatalf("the watch ended with %v before it reported server %s %s", err, srv.ID, what)
			case <-deadline:
				t.Fatalf("the watch did not report server %s %s within a minute", srv.ID, what)
			}
		}
	}
	await("at all", func(region.EventKind) bool { return true })
	if err := d.DeleteServer(t.Context(), srv.ID); err != nil {
		t.Fatalf("DeleteServer: %v", err)
	}
	await("deleted", func(k region.EventKind) bool { return k == region.ServerDeleted })
	cancel()
	if err := <-ended; err != nil {
		t.Errorf("Watch after its context ended: %v, want nil", err)
	}
}

// userData: a server's user data comes back with its SSH keys from every read, however long, in
// the spec it was made with; Nova is given the user data as it is when the spec has neither
// extra SSH keys nor a certificate authority, else a multipart whose parts are the user data,
// unchanged, and a cloud-config with the keys and the authority's key.
func (l *lab) userData(t *testing.T, d *ostack.Driver, cat *region.Catalog) {
	sp := spec("user-data")
	sp.UserData = []byte("#cloud-config\nruncmd: [[sh, -c, 'echo " + strings.Repeat("x", 400) + "']]\n")
	sp.SSHPublicKeys = []string{sshtest.PublicKey(t) + " " + strings.Repeat("c", 300)}
	created, err := d.CreateServer(t.Context(), sp)
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	t.Cleanup(func() { d.DeleteServer(context.Background(), created.ID) })
	got, err := d.GetServer(t.Context(), created.ID)
	if err != nil {
		t.Fatalf("GetServer: %v", err)
	}
	found, err := d.FindServers(t.Context(), sp.Scope, region.InstanceTag, sp.Tags[region.InstanceTag])
	if err != nil || len(found) != 1 {
		t.Fatalf("FindServers: %v (%v), want the server", found, err)
	}
	for what, srv := range map[string]region.Server{"CreateServer": created, "GetServer": got, "FindServers": found[0]} {
		if string(srv.UserData) != string(sp.UserData) || !slices.Equal(srv.SSHPublicKeys, sp.SSHPublicKeys) {
			t.Errorf("%s gave user data %q and SSH keys %q, want %q and %q", what, srv.UserData, srv.SSHPublicKeys, sp.UserData, sp.SSHPublicKeys)
		}
	}
	user, keys, caKeys := ostack.GuestParts(t, l.novaUserData(t, created.ID))
	if string(user) != string(sp.UserData) || !slices.Equal(keys, sp.SSHPublicKeys) || caKeys != "" {
		t.Errorf("Nova has user data %q, keys %q and CA keys %q; want %q, %q and none", user, keys, caKeys, sp.UserData, sp.SSHPublicKeys)
	}

	plain := spec("plain-user-data")
	plain.UserData = []byte("#!/bin/sh\necho plain\n")
	plainSrv, err := d.CreateServer(t.Context(), plain)
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	t.Cleanup(func() { d.DeleteServer(context.Background(), plainSrv.ID) })
	if b := l.novaUserData(t, plainSrv.ID); string(b) != string(plain.UserData) {
		t.Errorf("without SSH keys or a CA Nova has user data %q, want %q as it is", b, plain.UserData)
	}

	withCA := spec("ca-user-data")
	withCA.SSHCertificateAuthorityID = "ca-web"
	caSrv, err := d.CreateServer(t.Context(), withCA)
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	t.Cleanup(func() { d.DeleteServer(context.Background(), caSrv.ID) })
	ca, _ := cat.SSHCertificateAuthority("ca-web")
	user, keys, caKeys = ostack.GuestParts(t, l.novaUserData(t, caSrv.ID))
	if user != nil || keys != nil || caKeys != ca.PublicKey+"\n" {
		t.Errorf("with a CA only Nova has user data %q, keys %q and CA keys %q; want only the CA's key %q", user, keys, caKeys, ca.PublicKey)
	}
}

// novaUserData is the user data Nova was given for a server, which the admin the tests run as
// may read.
func (l *lab) novaUserData(t *testing.T, id string) []byte {
	t.Helper()
	admin := *l.compute
	admin.Microversion = "2.3"
	s, err := servers.Get(t.Context(), &admin, id).Extract()
	if err != nil || s.Userdata == nil {
		t.Fatalf("read server %s as an admin: %v", id, err)
	}
	b, err := base64.StdEncoding.DecodeString(*s.Userdata)
	if err != nil {
		t.Fatalf("Nova's user data of server %s: %v", id, err)
	}
	return b
}

// checkCatalogue: Check finds every catalogue entry in the cloud, by id or by name, and a server
// is made of the objects names give; it names each entry the cloud lacks, or has two of by the
// name given, and is refused.
func (l *lab) checkCatalogue(t *testing.T) {
	cat := l.catalog(t, "")
	byName := func(kind, id string) *region.OpenStackRef {
		t.Helper()
		switch kind {
		case "flavor":
			f, _ := cat.Flavor(id)
			return f.OpenStack
		case "image":
			im, _ := cat.Image(id)
			return im.OpenStack
		}
		sg, _ := cat.SecurityGroup(id)
		return sg.OpenStack
	}
	*byName("flavor", "small") = region.OpenStackRef{Name: "computeql.small"}
	*byName("image", "cirros") = region.OpenStackRef{Name: "computeql-tiny"}
	*byName("group", "os-ssh") = region.OpenStackRef{Name: "computeql-test-ssh"}
	d := l.driver(t, cat)
	if err := d.Check(t.Context()); err != nil {
		t.Fatalf("Check of a catalogue the cloud has: %v", err)
	}
	sp := spec("by-name")
	sp.FlavorID = "small"
	sp.Networking.SecurityGroupIDs = []string{"os-ssh"}
	srv, err := d.CreateServer(t.Context(), sp)
	if err != nil {
		t.Fatalf("CreateServer of objects named by name: %v", err)
	}
	t.Cleanup(func() { d.DeleteServer(context.Background(), srv.ID) })
	nova, err := servers.Get(t.Context(), l.compute, srv.ID).Extract()
	if err != nil || nova.Flavor["id"] != l.bigFlavorID || nova.Image["id"] != l.cloud.ImageID {
		t.Errorf("Nova's server %s has flavor %v and image %v (%v); want the named %s and %s", srv.ID, nova.Flavor["id"], nova.Image["id"], err,
			l.bigFlavorID, l.cloud.ImageID)
	}

	twin, err := groups.Create(t.Context(), l.network, groups.CreateOpts{Name: "computeql-test-ssh"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { groups.Delete(context.Background(), l.network, twin.ID) })
	bad := l.catalog(t, "")
	cat = bad
	*byName("flavor", "small") = region.OpenStackRef{Name: "no-such-flavor"}
	*byName("image", "cirros") = region.OpenStackRef{ID: "00000000-0000-0000-0000-000000000000"}
	*byName("group", "os-ssh") = region.OpenStackRef{Name: "computeql-test-ssh"}
	err = l.driver(t, bad).Check(t.Context())
	for _, want := range []string{
		`catalogue flavor "small": the cloud has no flavor named "no-such-flavor"`,
		`catalogue image "cirros": the cloud has no image 00000000-0000-0000-0000-000000000000`,
		`catalogue security group "os-ssh": the cloud has 2 security groups named "computeql-test-ssh"`,
	} {
		if !errors.Is(err, region.ErrRefused) || err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check of a catalogue the cloud lacks: %v; want ErrRefused saying %s", err, want)
		}
	}
}

// getServer is GetServer, failing the test on an error.
func getServer(t *testing.T, d *ostack.Driver, id string) region.Server {
	t.Helper()
	srv, err := d.GetServer(t.Context(), id)
	if err != nil {
		t.Fatalf("GetServer %s: %v", id, err)
	}
	return srv
}

// snapshotOfSnapshot: Nova copies an image's properties into a snapshot of a server made from
// it; the second snapshot has its own tags (none), not the first one's, and descends from the
// catalogue image the first one does.
func snapshotOfSnapshot(t *testing.T, d *ostack.Driver) {
	awaitRunning := func(id string) {
		t.Helper()
		eventually.Holds(t, time.Minute, func() bool { return getServer(t, d, id).State == region.ServerRunning }, "server %s RUNNING", id)
	}
	awaitReady := func(id string) region.Image {
		t.Helper()
		var got region.Image
		eventually.Holds(t, time.Minute, func() bool {
			images, err := d.Images(t.Context(), "acme", "web")
			if err != nil {
				t.Fatalf("Images: %v", err)
			}
			i := slices.IndexFunc(images, func(im region.Image) bool { return im.ID == id })
			if i >= 0 {
				got = images[i]
			}
			return got.State == region.ImageStateReady
		}, "image %s READY", id)
		return got
	}
	first, err := d.CreateServer(t.Context(), spec("snapshotted"))
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	t.Cleanup(func() { d.DeleteServer(context.Background(), first.ID) })
	awaitRunning(first.ID)
	a, err := d.Snapshot(t.Context(), first.ID, region.ImageRequest{Name: "first", Tags: map[string]string{"generation": "1"}})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	t.Cleanup(func() { d.DeleteImage(context.Background(), "acme", "web", a.ID) })
	if listed := awaitReady(a.ID); !maps.Equal(listed.Tags, map[string]string{"generation": "1"}) {
		t.Errorf("Images lists the first snapshot with tags %v, want generation=1", listed.Tags)
	}

	sp := spec("from-snapshot")
	sp.ImageID = a.ID
	second, err := d.CreateServer(t.Context(), sp)
	if err != nil {
		t.Fatalf("CreateServer from snapshot %s: %v", a.ID, err)
	}
	t.Cleanup(func() { d.DeleteServer(context.Background(), second.ID) })
	awaitRunning(second.ID)
	b, err := d.Snapshot(t.Context(), second.ID, region.ImageRequest{Name: "second"})
	if err != nil {
		t.Fatalf("Snapshot of the server made from a snapshot: %v", err)
	}
	t.Cleanup(func() { d.DeleteImage(context.Background(), "acme", "web", b.ID) })
	got := awaitReady(b.ID)
	if len(got.Tags) != 0 || got.Name != "second" || got.Architecture != a.Architecture || got.Virtualization != a.Virtualization || got.SizeGiB != a.SizeGiB {
		t.Errorf("the second snapshot is %+v; want its own name, no tags, and the first one's shape (%+v)", got, a)
	}

	// Another project's server does not boot from the project's snapshot.
	other := spec("other-project")
	other.ImageID = a.ID
	other.ProjectID = "mobile"
	if _, err := d.CreateServer(t.Context(), other); !errors.Is(err, region.ErrRefused) || !strings.Contains(err.Error(), a.ID) {
		t.Errorf("CreateServer of another project from the snapshot: %v, want ErrRefused for the image %s", err, a.ID)
	}
}

// regionOnly: Servers lists the region's servers with their spec, and neither it nor GetServer
// knows a server of the cloud project that computeql did not make.
func (l *lab) regionOnly(t *testing.T, d *ostack.Driver) {
	sp := spec("listed")
	srv, err := d.CreateServer(t.Context(), sp)
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	t.Cleanup(func() { d.DeleteServer(context.Background(), srv.ID) })
	other, err := servers.Create(t.Context(), l.compute, servers.CreateOpts{
		Name: "made-by-hand", FlavorRef: l.cloud.FlavorID, ImageRef: l.cloud.ImageID, Networks: []servers.Network{{UUID: l.cloud.NetworkID}},
	}, nil).Extract()
	if err != nil {
		t.Fatalf("create a server by hand: %v", err)
	}
	t.Cleanup(func() { servers.Delete(context.Background(), l.compute, other.ID) })

	all, err := d.Servers(t.Context())
	if err != nil {
		t.Fatalf("Servers: %v", err)
	}
	i := slices.IndexFunc(all, func(s region.Server) bool { return s.ID == srv.ID })
	if i < 0 {
		t.Fatalf("Servers lists %d servers, without %s", len(all), srv.ID)
	}
	if got := all[i]; got.Scope != sp.Scope || got.Name != sp.Name || got.FlavorID != sp.FlavorID || !maps.Equal(got.Tags, sp.Tags) {
		t.Errorf("Servers lists %+v, want the spec %+v", got.ServerSpec, sp)
	}
	if got, one := all[i], getServer(t, d, srv.ID); got.PrivateIP == "" || got.PrivateIP != one.PrivateIP || got.MAC != one.MAC {
		t.Errorf("Servers lists address %q and MAC %q, GetServer %q and %q: want the port's", got.PrivateIP, got.MAC, one.PrivateIP, one.MAC)
	}
	if slices.ContainsFunc(all, func(s region.Server) bool { return s.ID == other.ID }) {
		t.Errorf("Servers lists %s, which computeql did not make", other.ID)
	}
	if _, err := d.GetServer(t.Context(), other.ID); !errors.Is(err, region.ErrServerNotFound) {
		t.Errorf("GetServer of a server computeql did not make: %v, want ErrServerNotFound", err)
	}
}

// securityGroups: a server's port has the cloud's groups its catalogue groups name and a group
// of its own whose ingress rules are its allowed source addresses; UpdateNetworking changes
// both in place; DeleteServer takes the port and the group with the server.
func (l *lab) securityGroups(t *testing.T, d *ostack.Driver) {
	sp := spec("groups")
	sp.Networking = region.ServerNetworking{SecurityGroupIDs: []string{"os-ssh"}, AllowedSourceAddresses: []string{"203.0.113.0/24"}}
	value := sp.Tags[region.InstanceTag]
	srv, err := d.CreateServer(t.Context(), sp)
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	t.Cleanup(func() { d.DeleteServer(context.Background(), srv.ID) })
	port := l.port(t, value)
	allow := l.enforced(t, port, l.sshGroupID)
	if got := l.allowed(t, allow); !slices.Equal(got, []string{"203.0.113.0/24"}) {
		t.Errorf("the server's own group lets in %v, want 203.0.113.0/24", got)
	}

	n := region.ServerNetworking{AllowedSourceAddresses: []string{"192.0.2.128/25", "198.51.100.0/24"}}
	got, err := d.UpdateNetworking(t.Context(), srv.ID, n)
	if err != nil {
		t.Fatalf("UpdateNetworking: %v", err)
	}
	if got.Networking.SecurityGroupIDs != nil || !slices.Equal(got.Networking.AllowedSourceAddresses, n.AllowedSourceAddresses) {
		t.Errorf("UpdateNetworking returned networking %+v, want %+v", got.Networking, n)
	}
	port = l.port(t, value)
	if again := l.enforced(t, port); again != allow {
		t.Errorf("after the update the port's own group is %s, want it kept: %s", again, allow)
	}
	if got := l.allowed(t, allow); !slices.Equal(got, n.AllowedSourceAddresses) {
		t.Errorf("after the update the server's own group lets in %v, want %v", got, n.AllowedSourceAddresses)
	}

	for name, bad := range map[string]region.ServerNetworking{
		"an unknown group":           {SecurityGroupIDs: []string{"no-such-group"}},
		"a prefix with its host set": {AllowedSourceAddresses: []string{"10.1.2.3/8"}},
		"an IPv6 prefix":             {AllowedSourceAddresses: []string{"2001:db8::/32"}},
	} {
		if _, err := d.UpdateNetworking(t.Context(), srv.ID, bad); !errors.Is(err, region.ErrRefused) {
			t.Errorf("UpdateNetworking to %s: %v, want ErrRefused", name, err)
		}
	}
	if got := l.allowed(t, allow); !slices.Equal(got, n.AllowedSourceAddresses) {
		t.Errorf("after the refused updates the server's own group lets in %v, want %v", got, n.AllowedSourceAddresses)
	}

	if err := d.DeleteServer(t.Context(), srv.ID); err != nil {
		t.Fatalf("DeleteServer: %v", err)
	}
	if left := l.leftBehind(t, value); left != "" {
		t.Errorf("DeleteServer left %s behind", left)
	}
}

// port is the port the driver made for the server of the instance tag's value.
func (l *lab) port(t *testing.T, value string) ports.Port {
	t.Helper()
	pages, err := ports.List(l.network, ports.ListOpts{Name: "computeql-" + value}).AllPages(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	list, err := ports.ExtractPorts(pages)
	if err != nil || len(list) != 1 {
		t.Fatalf("ports of %s: %v (%v), want one", value, list, err)
	}
	return list[0]
}

// enforced checks that the port has exactly the cloud's groups and one more, which it returns:
// the server's own.
func (l *lab) enforced(t *testing.T, port ports.Port, cloudGroups ...string) string {
	t.Helper()
	var own []string
	for _, g := range port.SecurityGroups {
		if !slices.Contains(cloudGroups, g) {
			own = append(own, g)
		}
	}
	for _, g := range cloudGroups {
		if !slices.Contains(port.SecurityGroups, g) {
			t.Errorf("port %s has groups %v, without %s", port.ID, port.SecurityGroups, g)
		}
	}
	if len(own) != 1 {
		t.Fatalf("port %s has groups %v: want %v and one of the server's own", port.ID, port.SecurityGroups, cloudGroups)
	}
	return own[0]
}

// allowed is the sorted source prefixes a group's ingress rules let in.
func (l *lab) allowed(t *testing.T, group string) []string {
	t.Helper()
	pages, err := rules.List(l.network, rules.ListOpts{SecGroupID: group, Direction: string(rules.DirIngress)}).AllPages(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	list, err := rules.ExtractRules(pages)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range list {
		out = append(out, r.RemoteIPPrefix)
	}
	slices.Sort(out)
	return out
}

// leftBehind names what the driver made in Neutron for the instance tag's value and is still
// there, or "".
func (l *lab) leftBehind(t *testing.T, value string) string {
	t.Helper()
	var left []string
	pages, err := ports.List(l.network, ports.ListOpts{Name: "computeql-" + value}).AllPages(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if list, _ := ports.ExtractPorts(pages); len(list) > 0 {
		left = append(left, fmt.Sprintf("%d ports", len(list)))
	}
	pages, err = groups.List(l.network, groups.ListOpts{Name: "computeql-allow-" + value}).AllPages(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if list, _ := groups.ExtractGroups(pages); len(list) > 0 {
		left = append(left, fmt.Sprintf("%d security groups", len(list)))
	}
	if list := l.floatingIPsOf(t, value); len(list) > 0 {
		left = append(left, fmt.Sprintf("%d floating IPs", len(list)))
	}
	return strings.Join(left, " and ")
}

// quota: a create beyond the project's quota of servers is ErrNoCapacity with Nova's words,
// and leaves nothing behind.
func (l *lab) quota(t *testing.T, d *ostack.Driver) {
	// The quota is what the project uses once the servers deleted before are gone (they count
	// until then): none, so that the next server is one too many.
	eventually.Holds(t, time.Minute, func() bool {
		usage, err := quotasets.GetDetail(t.Context(), l.compute, l.cloud.ProjectID).Extract()
		if err != nil {
			t.Fatalf("read the project's quota: %v", err)
		}
		return usage.Instances.InUse+usage.Instances.Reserved == 0
	}, "the project's servers are all gone")
	zero, unlimited := 0, -1
	if _, err := quotasets.Update(t.Context(), l.compute, l.cloud.ProjectID, quotasets.UpdateOpts{Instances: &zero}).Extract(); err != nil {
		t.Fatalf("set the project's quota of servers to 0: %v", err)
	}
	t.Cleanup(func() {
		if _, err := quotasets.Update(context.Background(), l.compute, l.cloud.ProjectID, quotasets.UpdateOpts{Instances: &unlimited}).Extract(); err != nil {
			t.Errorf("lift the project's quota of servers: %v", err)
		}
	})
	sp := spec("over-quota")
	_, err := d.CreateServer(t.Context(), sp)
	if !errors.Is(err, region.ErrNoCapacity) || !strings.Contains(err.Error(), "Quota exceeded") {
		t.Fatalf("CreateServer beyond the quota: %v, want ErrNoCapacity with Nova's words", err)
	}
	if found, err := d.FindServers(t.Context(), sp.Scope, region.InstanceTag, sp.Tags[region.InstanceTag]); err != nil || len(found) != 0 {
		t.Errorf("FindServers after the refused create: %v (%v), want none", found, err)
	}
	if left := l.leftBehind(t, sp.Tags[region.InstanceTag]); left != "" {
		t.Errorf("the refused create left %s behind", left)
	}
}

// floatingIPsOf are the floating IPs the driver made for the server of the instance tag's
// value: their description ends in the value, as the server's does.
func (l *lab) floatingIPsOf(t *testing.T, value string) []floatingips.FloatingIP {
	t.Helper()
	pages, err := floatingips.List(l.network, floatingips.ListOpts{}).AllPages(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	all, err := floatingips.ExtractFloatingIPs(pages)
	if err != nil {
		t.Fatal(err)
	}
	var out []floatingips.FloatingIP
	for _, f := range all {
		if strings.HasSuffix(f.Description, " "+value) {
			out = append(out, f)
		}
	}
	return out
}

// floatingIPs: a server made with a public IP has a floating IP of the external network (named
// by its name in the catalogue) on its port, which the server shows as its public IP;
// UpdateNetworking releases it and gives it another; DeleteServer releases it, leaving nothing
// in Neutron.
func (l *lab) floatingIPs(t *testing.T, d *ostack.Driver) {
	sp := spec("floating")
	sp.Networking.PublicIP = true
	value := sp.Tags[region.InstanceTag]
	srv, err := d.CreateServer(t.Context(), sp)
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	t.Cleanup(func() { d.DeleteServer(context.Background(), srv.ID) })
	port := l.port(t, value)
	fips := l.floatingIPsOf(t, value)
	if len(fips) != 1 || fips[0].PortID != port.ID || fips[0].FloatingNetworkID != l.cloud.ExternalNetworkID {
		t.Fatalf("floating IPs of the server: %+v, want one of network %s on port %s", fips, l.cloud.ExternalNetworkID, port.ID)
	}
	if srv.PublicIP != fips[0].FloatingIP || !srv.Networking.PublicIP {
		t.Errorf("CreateServer gave public IP %q (networking says %t), want %s", srv.PublicIP, srv.Networking.PublicIP, fips[0].FloatingIP)
	}
	found, err := d.FindServers(t.Context(), sp.Scope, region.InstanceTag, value)
	if err != nil || len(found) != 1 || found[0].PublicIP != fips[0].FloatingIP {
		t.Errorf("FindServers: %+v (%v), want the server with public IP %s", found, err, fips[0].FloatingIP)
	}

	off, err := d.UpdateNetworking(t.Context(), srv.ID, region.ServerNetworking{})
	if err != nil {
		t.Fatalf("UpdateNetworking without a public IP: %v", err)
	}
	if off.PublicIP != "" || off.Networking.PublicIP {
		t.Errorf("after turning the public IP off the server has %q (networking says %t)", off.PublicIP, off.Networking.PublicIP)
	}
	if left := l.floatingIPsOf(t, value); len(left) != 0 {
		t.Errorf("after turning the public IP off Neutron still has %+v", left)
	}

	on, err := d.UpdateNetworking(t.Context(), srv.ID, region.ServerNetworking{PublicIP: true})
	if err != nil {
		t.Fatalf("UpdateNetworking with a public IP: %v", err)
	}
	again, err := d.UpdateNetworking(t.Context(), srv.ID, region.ServerNetworking{PublicIP: true})
	if err != nil {
		t.Fatalf("UpdateNetworking with the public IP it has: %v", err)
	}
	fips = l.floatingIPsOf(t, value)
	if len(fips) != 1 || fips[0].PortID != port.ID || on.PublicIP != fips[0].FloatingIP || again.PublicIP != on.PublicIP {
		t.Errorf("after turning the public IP on twice: public IPs %q and %q, Neutron has %+v; want one floating IP on port %s, kept",
			on.PublicIP, again.PublicIP, fips, port.ID)
	}

	if err := d.DeleteServer(t.Context(), srv.ID); err != nil {
		t.Fatalf("DeleteServer: %v", err)
	}
	if left := l.leftBehind(t, value); left != "" {
		t.Errorf("DeleteServer left %s behind", left)
	}
}

// noExternalNetwork: a region that names no external network refuses public IPs, at the create
// (leaving nothing behind) and in an update (leaving the server as it was).
func (l *lab) noExternalNetwork(t *testing.T, d *ostack.Driver) {
	sp := spec("no-external")
	sp.Networking.PublicIP = true
	if _, err := d.CreateServer(t.Context(), sp); !errors.Is(err, region.ErrRefused) {
		t.Errorf("CreateServer with a public IP: %v, want ErrRefused", err)
	}
	if left := l.leftBehind(t, sp.Tags[region.InstanceTag]); left != "" {
		t.Errorf("the refused create left %s behind", left)
	}
	srv, err := d.CreateServer(t.Context(), spec("no-external"))
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	t.Cleanup(func() { d.DeleteServer(context.Background(), srv.ID) })
	if _, err := d.UpdateNetworking(t.Context(), srv.ID, region.ServerNetworking{PublicIP: true}); !errors.Is(err, region.ErrRefused) {
		t.Errorf("UpdateNetworking to a public IP: %v, want ErrRefused", err)
	}
	got, err := d.GetServer(t.Context(), srv.ID)
	if err != nil || got.PublicIP != "" || got.Networking.PublicIP {
		t.Errorf("after the refusal: %+v (%v), want no public IP", got, err)
	}
}

// floatingIPQuota: a create with a public IP beyond the project's quota of floating IPs is
// ErrNoCapacity with Neutron's words, and leaves nothing behind.
func (l *lab) floatingIPQuota(t *testing.T, d *ostack.Driver) {
	zero, unlimited := 0, -1
	if _, err := netquotas.Update(t.Context(), l.network, l.cloud.ProjectID, netquotas.UpdateOpts{FloatingIP: &zero}).Extract(); err != nil {
		t.Fatalf("set the project's quota of floating IPs to 0: %v", err)
	}
	t.Cleanup(func() {
		if _, err := netquotas.Update(context.Background(), l.network, l.cloud.ProjectID, netquotas.UpdateOpts{FloatingIP: &unlimited}).Extract(); err != nil {
			t.Errorf("lift the project's quota of floating IPs: %v", err)
		}
	})
	sp := spec("floating-over-quota")
	sp.Networking.PublicIP = true
	_, err := d.CreateServer(t.Context(), sp)
	if !errors.Is(err, region.ErrNoCapacity) || !strings.Contains(err.Error(), "floatingip") {
		t.Fatalf("CreateServer beyond the quota of floating IPs: %v, want ErrNoCapacity with Neutron's words", err)
	}
	if found, err := d.FindServers(t.Context(), sp.Scope, region.InstanceTag, sp.Tags[region.InstanceTag]); err != nil || len(found) != 0 {
		t.Errorf("FindServers after the refused create: %v (%v), want none", found, err)
	}
	if left := l.leftBehind(t, sp.Tags[region.InstanceTag]); left != "" {
		t.Errorf("the refused create left %s behind", left)
	}
}
