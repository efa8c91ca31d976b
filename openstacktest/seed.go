package openstacktest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"text/template"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/hypervisors"
	"github.com/gophercloud/gophercloud/v2/openstack/config"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/roles"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/services"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/users"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/external"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/provider"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
)

// ImageData is the content of the seeded image.
var ImageData = []byte("computeql test image\n")

// AdminClient authenticates as the admin user scoped to the admin project.
func (c *Cloud) AdminClient(ctx context.Context) (*gophercloud.ProviderClient, error) {
	return openstack.AuthenticatedClient(ctx, gophercloud.AuthOptions{
		IdentityEndpoint: c.AuthURL,
		Username:         c.Username,
		Password:         c.Password,
		DomainName:       c.UserDomain,
		Scope:            &gophercloud.AuthScope{ProjectName: "admin", DomainName: c.ProjectDomain},
	})
}

// Client authenticates through the clouds.yaml, as a driver configured with it would.
func (c *Cloud) Client(ctx context.Context) (*gophercloud.ProviderClient, gophercloud.EndpointOpts, error) {
	ao, eo, _, err := clouds.Parse(clouds.WithCloudName(CloudName), clouds.WithLocations(c.CloudsYAML))
	if err != nil {
		return nil, eo, err
	}
	pc, err := config.NewProviderClient(ctx, ao)
	return pc, eo, err
}

// registerCatalog adds the services' endpoints to Keystone (bootstrap made the identity
// one), creates the test's project and gives the admin user the admin role in it, then
// writes clouds.yaml.
func (c *Cloud) registerCatalog(ctx context.Context) error {
	pc, err := c.AdminClient(ctx)
	if err != nil {
		return fmt.Errorf("keystone: authenticate: %w", err)
	}
	id, err := openstack.NewIdentityV3(pc, gophercloud.EndpointOpts{Region: c.Region})
	if err != nil {
		return err
	}
	for _, typ := range []string{"image", "placement", "compute", "network"} {
		names := map[string]string{"image": "glance", "placement": "placement", "compute": "nova", "network": "neutron"}
		svc, err := services.Create(ctx, id, services.CreateOpts{Type: typ, Extra: map[string]any{"name": names[typ]}}).Extract()
		if err != nil {
			return fmt.Errorf("keystone: create service %s: %w", typ, err)
		}
		for _, iface := range []gophercloud.Availability{gophercloud.AvailabilityPublic, gophercloud.AvailabilityInternal} {
			_, err := endpoints.Create(ctx, id, endpoints.CreateOpts{
				Availability: iface, Region: c.Region, URL: c.Endpoints[typ], ServiceID: svc.ID,
			}).Extract()
			if err != nil {
				return fmt.Errorf("keystone: create endpoint %s: %w", typ, err)
			}
		}
	}
	proj, err := projects.Create(ctx, id, projects.CreateOpts{Name: c.ProjectName, DomainID: "default"}).Extract()
	if err != nil {
		return fmt.Errorf("keystone: create project: %w", err)
	}
	c.ProjectID = proj.ID
	rp, err := roles.List(id, roles.ListOpts{Name: "admin"}).AllPages(ctx)
	if err != nil {
		return err
	}
	rs, err := roles.ExtractRoles(rp)
	if err != nil || len(rs) != 1 {
		return fmt.Errorf("keystone: find role admin: %v (%d found)", err, len(rs))
	}
	up, err := users.List(id, users.ListOpts{Name: c.Username}).AllPages(ctx)
	if err != nil {
		return err
	}
	us, err := users.ExtractUsers(up)
	if err != nil || len(us) != 1 {
		return fmt.Errorf("keystone: find user %s: %v (%d found)", c.Username, err, len(us))
	}
	if err := roles.Assign(ctx, id, rs[0].ID, roles.AssignOpts{UserID: us[0].ID, ProjectID: proj.ID}).ExtractErr(); err != nil {
		return fmt.Errorf("keystone: assign admin on %s: %w", c.ProjectName, err)
	}
	return c.writeCloudsYAML()
}

var cloudsYAML = template.Must(template.New("clouds.yaml").Parse(`clouds:
  {{.Name}}:
    auth:
      auth_url: {{.C.AuthURL}}
      username: {{.C.Username}}
      password: {{.C.Password}}
      user_domain_name: {{.C.UserDomain}}
      project_name: {{.C.ProjectName}}
      project_domain_name: {{.C.ProjectDomain}}
    region_name: {{.C.Region}}
    interface: public
    identity_api_version: 3
`))

func (c *Cloud) writeCloudsYAML() error {
	var b bytes.Buffer
	if err := cloudsYAML.Execute(&b, struct {
		Name string
		C    *Cloud
	}{CloudName, c}); err != nil {
		return err
	}
	c.CloudsYAML = filepath.Join(c.Dir, "clouds.yaml")
	return os.WriteFile(c.CloudsYAML, b.Bytes(), 0o600)
}

// seed creates the flavor, the image and the network with its subnet, through clouds.yaml.
func (c *Cloud) seed(ctx context.Context) error {
	pc, eo, err := c.Client(ctx)
	if err != nil {
		return fmt.Errorf("authenticate through clouds.yaml: %w", err)
	}
	compute, err := openstack.NewComputeV2(pc, eo)
	if err != nil {
		return err
	}
	public := true
	ram := 64
	if c.opts.Libvirt != nil {
		ram = guestMemoryMiB
	}
	fl, err := flavors.Create(ctx, compute, flavors.CreateOpts{
		Name: "computeql.tiny", VCPUs: 1, RAM: ram, Disk: gophercloud.IntToPointer(1), IsPublic: &public,
	}).Extract()
	if err != nil {
		return fmt.Errorf("create flavor: %w", err)
	}
	c.FlavorID = fl.ID

	image, err := openstack.NewImageV2(pc, eo)
	if err != nil {
		return err
	}
	if c.opts.Libvirt != nil {
		c.ImageID, err = c.seedGuestImage(ctx, image)
	} else {
		c.ImageID, err = uploadImage(ctx, image, images.CreateOpts{Name: "computeql-tiny", ContainerFormat: "bare", DiskFormat: "raw"},
			bytes.NewReader(ImageData))
	}
	if err != nil {
		return err
	}

	network, err := openstack.NewNetworkV2(pc, eo)
	if err != nil {
		return err
	}
	shared, up := true, true
	nw, err := networks.Create(ctx, network, provider.CreateOptsExt{
		CreateOptsBuilder: networks.CreateOpts{Name: "computeql-net", Shared: &shared, AdminStateUp: &up},
		Segments:          []provider.Segment{{NetworkType: "flat", PhysicalNetwork: "physnet1"}},
	}).Extract()
	if err != nil {
		return fmt.Errorf("create network: %w", err)
	}
	c.NetworkID = nw.ID
	dhcp := false
	// 192.0.2.0/24 is reserved for documentation: nothing is ever sent to it, the fake
	// driver plugs no interface.
	sn, err := subnets.Create(ctx, network, subnets.CreateOpts{
		NetworkID: nw.ID, Name: "computeql-subnet", CIDR: "192.0.2.0/24", IPVersion: gophercloud.IPv4, EnableDHCP: &dhcp,
	}).Extract()
	if err != nil {
		return fmt.Errorf("create subnet: %w", err)
	}
	c.SubnetID = sn.ID
	return c.seedExternal(ctx, network)
}

// guestMemoryMiB is the seeded flavor's memory for a libvirt compute: what a Debian kernel
// and a busybox initramfs boot in.
const guestMemoryMiB = 256

// uploadImage creates a public image and uploads its data.
func uploadImage(ctx context.Context, image *gophercloud.ServiceClient, opts images.CreateOpts, data io.Reader) (string, error) {
	vis := images.ImageVisibilityPublic
	opts.Visibility = &vis
	im, err := images.Create(ctx, image, opts).Extract()
	if err != nil {
		return "", fmt.Errorf("create image %s: %w", opts.Name, err)
	}
	if err := imagedata.Upload(ctx, image, im.ID, data).ExtractErr(); err != nil {
		return "", fmt.Errorf("upload image %s: %w", opts.Name, err)
	}
	return im.ID, nil
}

// uploadFile uploads a file as a public image.
func uploadFile(ctx context.Context, image *gophercloud.ServiceClient, opts images.CreateOpts, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return uploadImage(ctx, image, opts, f)
}

// seedGuestImage uploads the libvirt compute's guest: its kernel and initramfs, and the image
// servers boot, an empty raw disk whose kernel_id and ramdisk_id name both, with the kernel's
// command line (the console on the serial port, which Nova logs; no DHCP, which a cloud
// without Neutron's agents does not serve). All three are raw: this
// Nova's image inspection refuses the ami, aki and ari formats meant for such images (qemu-img
// reads them as raw, which it takes for a mismatch).
func (c *Cloud) seedGuestImage(ctx context.Context, image *gophercloud.ServiceClient) (string, error) {
	lv := c.opts.Libvirt
	var err error
	c.KernelImageID, err = uploadFile(ctx, image, images.CreateOpts{Name: "computeql-guest-kernel", ContainerFormat: "bare", DiskFormat: "raw"}, lv.Kernel)
	if err != nil {
		return "", err
	}
	c.RamdiskImageID, err = uploadFile(ctx, image, images.CreateOpts{Name: "computeql-guest-initrd", ContainerFormat: "bare", DiskFormat: "raw"}, lv.Initrd)
	if err != nil {
		return "", err
	}
	return uploadImage(ctx, image, images.CreateOpts{
		Name: GuestImageName, ContainerFormat: "bare", DiskFormat: "raw",
		Properties: map[string]string{"kernel_id": c.KernelImageID, "ramdisk_id": c.RamdiskImageID, "os_command_line": "console=ttyS0 computeql.nodhcp"},
	}, bytes.NewReader(make([]byte, 1<<20)))
}

// GuestImageName is the Glance name of the image a libvirt compute's servers boot.
const GuestImageName = "computeql-guest"

// seedExternal creates the external network with its subnet and the router from the seeded
// subnet to it, without which Neutron gives no floating IP to a port of that subnet.
func (c *Cloud) seedExternal(ctx context.Context, network *gophercloud.ServiceClient) error {
	isExternal, up, dhcp := true, true, false
	nw, err := networks.Create(ctx, network, external.CreateOptsExt{
		CreateOptsBuilder: provider.CreateOptsExt{
			CreateOptsBuilder: networks.CreateOpts{Name: "computeql-public", AdminStateUp: &up},
			// A flat network takes a physical network of its own.
			Segments: []provider.Segment{{NetworkType: "flat", PhysicalNetwork: "physnet2"}},
		},
		External: &isExternal,
	}).Extract()
	if err != nil {
		return fmt.Errorf("create external network: %w", err)
	}
	c.ExternalNetworkID = nw.ID
	// 198.51.100.0/24 is reserved for documentation, as the tenant subnet's range is.
	if _, err := subnets.Create(ctx, network, subnets.CreateOpts{
		NetworkID: nw.ID, Name: "computeql-public-subnet", CIDR: "198.51.100.0/24", IPVersion: gophercloud.IPv4, EnableDHCP: &dhcp,
	}).Extract(); err != nil {
		return fmt.Errorf("create external subnet: %w", err)
	}
	r, err := routers.Create(ctx, network, routers.CreateOpts{
		Name: "computeql-router", AdminStateUp: &up, GatewayInfo: &routers.GatewayInfo{NetworkID: nw.ID},
	}).Extract()
	if err != nil {
		return fmt.Errorf("create router: %w", err)
	}
	c.RouterID = r.ID
	if _, err := routers.AddInterface(ctx, network, r.ID, routers.AddInterfaceOpts{SubnetID: c.SubnetID}).Extract(); err != nil {
		return fmt.Errorf("add the tenant subnet to the router: %w", err)
	}
	return nil
}

// discoverCompute waits for the compute's resource provider to have room for the flavor in
// Placement (the compute node record is made just before it), maps the compute into cell1
// (the scheduler's own periodic discovery is off), then waits for it to be listed up as a
// hypervisor, which the API does only for mapped hosts.
func (c *Cloud) discoverCompute(ctx context.Context, compute *proc, novaConf string) error {
	pc, err := c.AdminClient(ctx)
	if err != nil {
		return err
	}
	placement, err := openstack.NewPlacementV1(pc, gophercloud.EndpointOpts{Region: c.Region})
	if err != nil {
		return err
	}
	placement.Microversion = "1.4"
	err = poll(ctx, 300*time.Millisecond, "nova-compute's inventory in Placement", compute, func() error {
		pages, err := resourceproviders.List(placement, resourceproviders.ListOpts{Resources: "VCPU:1,MEMORY_MB:64,DISK_GB:1"}).AllPages(ctx)
		if err != nil {
			return err
		}
		rps, err := resourceproviders.ExtractResourceProviders(pages)
		if err != nil {
			return err
		}
		if len(rps) == 0 {
			return fmt.Errorf("no resource provider with room for the flavor")
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := c.run(ctx, "nova-manage", c.env, "/usr/bin/nova-manage", "--config-file", novaConf, "cell_v2", "discover_hosts", "--verbose"); err != nil {
		return err
	}
	nova, err := openstack.NewComputeV2(pc, gophercloud.EndpointOpts{Region: c.Region})
	if err != nil {
		return err
	}
	return poll(ctx, 300*time.Millisecond, "nova-compute's hypervisor", compute, func() error {
		pages, err := hypervisors.List(nova, nil).AllPages(ctx)
		if err != nil {
			return err
		}
		hs, err := hypervisors.ExtractHypervisors(pages)
		if err != nil {
			return err
		}
		for _, h := range hs {
			if h.State == "up" && h.Status == "enabled" {
				return nil
			}
		}
		return fmt.Errorf("%d hypervisors, none up (discover_hosts: %s)", len(hs), tail(filepath.Join(c.Dir, "logs", "nova-manage.log"), 5))
	})
}

// amqpHandshake checks that an AMQP 0-9-1 broker answers the protocol header with a frame.
func amqpHandshake(port int) error {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
		return err
	}
	b := make([]byte, 1)
	if _, err := conn.Read(b); err != nil {
		return err
	}
	if b[0] != 1 {
		return fmt.Errorf("AMQP: unexpected frame type %d", b[0])
	}
	return nil
}
