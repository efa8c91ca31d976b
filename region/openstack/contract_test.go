package openstack_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"golang.org/x/crypto/ssh"

	"github.com/computeql/computeql/openstacktest"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	ostack "github.com/computeql/computeql/region/openstack"
	"github.com/computeql/computeql/region/regiontest"
)

var redisServer *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &redisServer) }

// lab is a control plane with what the driver's tests need beside the seed: a second, larger
// flavor to resize to.
type lab struct {
	cloud       *openstacktest.Cloud
	bigFlavorID string
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
	disk := 2
	big, err := flavors.Create(t.Context(), compute, flavors.CreateOpts{Name: "computeql.small", VCPUs: 2, RAM: 128, Disk: &disk}).Extract()
	if err != nil {
		t.Fatalf("create a flavor to resize to: %v", err)
	}
	return &lab{cloud: c, bigFlavorID: big.ID}
}

// catalog is an OpenStack region "os" of the lab's cloud: acme/web's network is the seeded
// one, flavor tiny the seeded flavor and small the larger one, image cirros the seeded image.
func (l *lab) catalog(t *testing.T) *region.Catalog {
	t.Helper()
	caPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(caPub)
	if err != nil {
		t.Fatal(err)
	}
	c := l.cloud
	doc := fmt.Sprintf(`{
  "regions": [{"id": "os", "name": "OpenStack", "driver": "openstack",
    "openstack": {"cloud": %q, "pollInterval": "250ms"}}],
  "organizations": [{"id": "acme", "name": "Acme", "projects": [{"id": "web", "name": "Web"}]}],
  "networks": [{"id": "os-web", "name": "web", "organizationId": "acme", "projectId": "web", "region": "os",
    "prefix": "192.0.2.0/24", "openstack": {"id": %q}}],
  "securityGroups": [],
  "sshCertificateAuthorities": [{"id": "ca-web", "name": "web CA", "organizationId": "acme", "projectId": "web", "publicKey": %q}],
  "flavors": [{"id": "tiny", "name": "tiny", "cpus": 1, "memoryGiB": 1, "diskGB": 1, "architecture": "x86_64", "regions": ["os"],
      "openstack": {"id": %q}},
    {"id": "small", "name": "small", "cpus": 2, "memoryGiB": 1, "diskGB": 2, "architecture": "x86_64", "regions": ["os"],
      "openstack": {"id": %q}}],
  "images": [{"id": "cirros", "name": "cirros", "architecture": "x86_64", "sizeGiB": 1, "virtualization": "virtualized",
    "state": "ready", "regions": ["os"], "openstack": {"id": %q}}]
}`, openstacktest.CloudName, c.NetworkID, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))), c.FlavorID, l.bigFlavorID, c.ImageID)
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

// TestOpenStackContract runs the region contract against Nova (with its fake virt driver),
// Neutron and Glance of a real control plane.
func TestOpenStackContract(t *testing.T) {
	l := startLab(t)
	cat := l.catalog(t)
	regiontest.Run(t, regiontest.Harness{
		Client: l.driver(t, cat), Catalog: cat, Spec: spec, ResizeFlavor: "small", Timeout: time.Minute,
		Capabilities: regiontest.Capabilities{NoConsole: true},
	})
}
