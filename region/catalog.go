// Package region holds what the region owns and users may read: its catalogue of regions,
// organizations and projects, networks, security groups, SSH certificate authorities,
// flavors and images. The catalogue is read-only data loaded from a file (or the built-in
// demo); the instance rules in package instance validate requests against it.
package region

import (
	"net/netip"

	"github.com/computeql/computeql/quota"
)

// Architecture is a CPU architecture. Values are those of the catalogue file.
type Architecture string

// Architectures a flavor or image can have.
const (
	ArchitectureX86_64  Architecture = "x86_64"
	ArchitectureAArch64 Architecture = "aarch64"
)

// Virtualization says which kinds of flavor an image can boot on.
type Virtualization string

// Virtualization modes of an image.
const (
	VirtualizationVirtualized Virtualization = "virtualized"
	VirtualizationBaremetal   Virtualization = "baremetal"
	VirtualizationAny         Virtualization = "any"
)

// ImageState is the lifecycle state of an image; only ready images can be booted.
type ImageState string

// Image states.
const (
	ImageStatePending  ImageState = "pending"
	ImageStateCreating ImageState = "creating"
	ImageStateReady    ImageState = "ready"
	ImageStateFailed   ImageState = "failed"
)

// Region drivers: what serves a region's servers.
const (
	// DriverSim is the simulated region, the default: servers live in Redis and follow a clock.
	DriverSim = "sim"
	// DriverLibvirt is libvirt hosts running QEMU: servers are virtual machines.
	DriverLibvirt = "libvirt"
	// DriverOpenStack is an OpenStack cloud: servers are Nova servers.
	DriverOpenStack = "openstack"
)

// Region is a location that offers flavors and images and holds networks.
type Region struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Driver names what serves the region's servers: DriverSim, DriverLibvirt or
	// DriverOpenStack. Defaults to DriverSim.
	Driver string `json:"driver,omitempty"`
	// Libvirt configures a DriverLibvirt region; it is required there and refused elsewhere.
	Libvirt *LibvirtRegion `json:"libvirt,omitempty"`
	// OpenStack configures a DriverOpenStack region; it is required there and refused
	// elsewhere.
	OpenStack *OpenStackRegion `json:"openstack,omitempty"`
}

// LibvirtRegion is where and how a libvirt region runs its virtual machines.
type LibvirtRegion struct {
	// URI is the libvirt connection URI of a region of one host: qemu:///system (optionally
	// with ?socket=/path/to/libvirt-sock) or qemu+tcp://host[:port]/system. A region of
	// several hosts lists them in Hosts instead.
	URI string `json:"uri,omitempty"`
	// Hosts are the region's hosts, when it has more than the one URI names. A new server
	// goes to the host with the most free memory that fits its flavor.
	Hosts []LibvirtHost `json:"hosts,omitempty"`
	// Pool is the storage pool that holds base images, overlays and seeds on each host; it is
	// created as a directory pool at PoolPath when missing. Defaults to "computeql".
	Pool string `json:"pool,omitempty"`
	// PoolPath is the directory of a pool computeql creates. Defaults to
	// /var/lib/libvirt/images/<pool>.
	PoolPath string `json:"poolPath,omitempty"`
	// Accel is how guests run: kvm, tcg (QEMU's software emulation), or auto (KVM when the
	// host's KVM can run guests, else TCG). Defaults to auto.
	Accel string `json:"accel,omitempty"`
	// StopTimeout is how long a graceful stop waits for the guest to power off after the ACPI
	// power button before it is forced off, and a soft reboot before it resets the guest, as a
	// Go duration. Defaults to 60s.
	StopTimeout string `json:"stopTimeout,omitempty"`
	// BuildTimeout is how long a new server's guest has to take its network address after
	// the domain started before the server shows ERROR, as a Go duration. Defaults to 10m.
	BuildTimeout string `json:"buildTimeout,omitempty"`
}

// LibvirtHost is one host of a libvirt region.
type LibvirtHost struct {
	// Name names the host in conditions, logs and metrics; it must stay the same for as long
	// as the host holds servers. Lower-case letters, digits and '-'.
	Name string `json:"name"`
	// URI is the host's libvirt connection URI, as LibvirtRegion.URI.
	URI string `json:"uri"`
	// PoolPath is the directory of the pool computeql creates on this host. Defaults to the
	// region's.
	PoolPath string `json:"poolPath,omitempty"`
	// Pool is the region's Pool; set by the catalogue's defaults.
	Pool string `json:"-"`
}

// DefaultLibvirtHost is the name of the one host of a region that gives a URI alone.
const DefaultLibvirtHost = "default"

// HostList returns the region's hosts, each with its pool settings: Hosts, or the one host
// URI names (DefaultLibvirtHost).
func (l *LibvirtRegion) HostList() []LibvirtHost {
	hosts := l.Hosts
	if len(hosts) == 0 {
		hosts = []LibvirtHost{{Name: DefaultLibvirtHost, URI: l.URI}}
	}
	out := make([]LibvirtHost, len(hosts))
	for i, h := range hosts {
		h.Pool = l.Pool
		if h.PoolPath == "" {
			h.PoolPath = l.PoolPath
		}
		out[i] = h
	}
	return out
}

// OpenStackRegion is the OpenStack cloud that serves a region. It names the cloud only: the
// credentials are in a clouds.yaml, found where OpenStack's own tools look for it
// ($OS_CLIENT_CONFIG_FILE, ./clouds.yaml, ~/.config/openstack/clouds.yaml,
// /etc/openstack/clouds.yaml), so that no secret is ever in the catalogue.
type OpenStackRegion struct {
	// Cloud is the cloud's name in clouds.yaml.
	Cloud string `json:"cloud"`
	// RequestTimeout bounds each call to the cloud's APIs, as a Go duration. Defaults to 30s.
	RequestTimeout string `json:"requestTimeout,omitempty"`
	// PollInterval is how often a watch asks Nova for the servers changed since its cursor, as
	// a Go duration. Defaults to 2s.
	PollInterval string `json:"pollInterval,omitempty"`
	// ExternalNetwork is the id or name of the Neutron external network (router:external)
	// whose floating IPs are the servers' public IP addresses. Without it the region offers
	// no public IPs.
	ExternalNetwork string `json:"externalNetwork,omitempty"`
}

// OpenStackRef names the cloud's own object behind a catalogue entry of an OpenStack region:
// a Nova flavor, a Glance image, a Neutron network or a Neutron security group, by its id or
// its name (one of the two). Without it the entry's catalogue id is taken as the cloud's id.
type OpenStackRef struct {
	// ID is the cloud's id of the object.
	ID string `json:"id,omitempty"`
	// Name is the cloud's name of the object, which the driver looks up: the cloud must have
	// exactly one object of that name.
	Name string `json:"name,omitempty"`
}

// Libvirt acceleration modes.
const (
	AccelAuto = "auto"
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// OffersPublicIPs reports whether servers of the region can have a public IP address. A
// libvirt region has no pool of public addresses to hand out; an OpenStack region hands out
// floating IPs of the external network it names, and none when it names none.
func (r *Region) OffersPublicIPs() bool {
	switch r.Driver {
	case DriverLibvirt:
		return false
	case DriverOpenStack:
		return r.OpenStack != nil && r.OpenStack.ExternalNetwork != ""
	}
	return true
}

// RunsFlavor says why the region cannot run servers of the flavor, or "" when it can: a
// libvirt region runs virtual machines on its hosts, with neither GPUs nor bare metal.
func (r *Region) RunsFlavor(f *Flavor) string {
	if r.Driver != DriverLibvirt {
		return ""
	}
	switch {
	case f.GPU != nil:
		return "it runs virtual machines on libvirt hosts, without GPUs"
	case f.Baremetal:
		return "it runs virtual machines on libvirt hosts, not bare metal"
	}
	return ""
}

// Organization is a tenant. Quota is charged per organization.
type Organization struct {
	ID       string    `json:"id"`
	Name     string    `json:"name"`
	Projects []Project `json:"projects"`
	// Quota holds the organization's initial limits by kind (servers, gpus, publicIPs, cpus,
	// memoryGiB). Kinds left out get quota.DefaultLimits.
	Quota quota.Amounts `json:"quota,omitempty"`
}

// Project groups an organization's resources.
type Project struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// Network belongs to exactly one organization, project and region.
type Network struct {
	ID             string `json:"id"`
	Name           string `json:"name"`
	OrganizationID string `json:"organizationId"`
	ProjectID      string `json:"projectId"`
	Region         string `json:"region"`
	// Prefix is the IPv4 prefix private addresses come from.
	Prefix netip.Prefix `json:"prefix"`
	// OpenStack names the Neutron network in an OpenStack region; its subnet must be Prefix.
	OpenStack *OpenStackRef `json:"openstack,omitempty"`
}

// SecurityGroup sits on one network.
type SecurityGroup struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	NetworkID string `json:"networkId"`
	// Rules say what traffic the group lets through. An instance's guest is reachable only
	// as the rules of its groups allow (and by replies to its own connections); it may send
	// anything while none of its groups has an egress rule, and only what those rules allow
	// once one does.
	Rules []SecurityGroupRule `json:"rules,omitempty"`
	// OpenStack names the Neutron security group that holds the rules in an OpenStack
	// region: the cloud enforces that group's rules, which the cloud's operator keeps.
	OpenStack *OpenStackRef `json:"openstack,omitempty"`
}

// SecurityGroupRule lets one kind of traffic through.
type SecurityGroupRule struct {
	Direction RuleDirection `json:"direction"`
	Protocol  RuleProtocol  `json:"protocol"`
	// PortMin and PortMax bound the destination ports of tcp and udp; both 0 means every port.
	PortMin int `json:"portMin,omitempty"`
	PortMax int `json:"portMax,omitempty"`
	// RemotePrefix is the IPv4 prefix of the other end, in canonical form. Defaults to
	// 0.0.0.0/0: anywhere.
	RemotePrefix string `json:"remotePrefix,omitempty"`
}

// RuleDirection is which way a rule lets traffic through.
type RuleDirection string

// Rule directions.
const (
	DirectionIngress RuleDirection = "ingress" // to the instance
	DirectionEgress  RuleDirection = "egress"  // from the instance
)

// RuleProtocol is the IP protocol a rule lets through.
type RuleProtocol string

// Rule protocols.
const (
	ProtocolTCP  RuleProtocol = "tcp"
	ProtocolUDP  RuleProtocol = "udp"
	ProtocolICMP RuleProtocol = "icmp"
	ProtocolAny  RuleProtocol = "any"
)

// SSHCertificateAuthority signs SSH user certificates for one organization and project.
type SSHCertificateAuthority struct {
	ID             string `json:"id"`
	Name           string `json:"name"`
	OrganizationID string `json:"organizationId"`
	ProjectID      string `json:"projectId"`
	// PublicKey is the CA's public key in authorized_keys form.
	PublicKey string `json:"publicKey"`
}

// GPU describes the accelerators of a flavor.
type GPU struct {
	Vendor        string `json:"vendor"`
	Model         string `json:"model"`
	MemoryGiB     int64  `json:"memoryGiB"`
	PhysicalCount int64  `json:"physicalCount"`
}

// Flavor is a machine shape.
type Flavor struct {
	ID           string       `json:"id"`
	Name         string       `json:"name"`
	CPUs         int64        `json:"cpus"`
	MemoryGiB    int64        `json:"memoryGiB"`
	DiskGB       int64        `json:"diskGB"` // 10^9 bytes
	Architecture Architecture `json:"architecture"`
	Baremetal    bool         `json:"baremetal"`
	GPU          *GPU         `json:"gpu,omitempty"`
	// Regions lists the regions that offer the flavor.
	Regions []string `json:"regions"`
	// OpenStack names the Nova flavor in OpenStack regions. Each Nova flavor should be named
	// by one catalogue flavor only: a server's flavor is read back from Nova's.
	OpenStack *OpenStackRef `json:"openstack,omitempty"`
}

// OperatingSystem describes what an image boots.
type OperatingSystem struct {
	Family  string `json:"family"`
	Distro  string `json:"distro"`
	Version string `json:"version"`
}

// Image is a bootable disk image.
type Image struct {
	ID             string           `json:"id"`
	Name           string           `json:"name"`
	Architecture   Architecture     `json:"architecture"`
	SizeGiB        int64            `json:"sizeGiB"` // 2^30 bytes
	Virtualization Virtualization   `json:"virtualization"`
	State          ImageState       `json:"state"`
	OS             *OperatingSystem `json:"os,omitempty"`
	// Regions lists the regions that offer the image.
	Regions []string `json:"regions"`
	// OrganizationID and ProjectID own an image the region made (a snapshot); catalogue
	// images have none and are public.
	OrganizationID string            `json:"organizationId,omitempty"`
	ProjectID      string            `json:"projectId,omitempty"`
	Tags           map[string]string `json:"tags,omitempty"`

	// What a libvirt region boots, ignored by the simulated one. File is a disk image (qcow2
	// or raw) imported into the region's pool when missing; Volume names a volume already in
	// the pool. Kernel and Initrd boot the guest directly (with Cmdline), with or without a
	// disk: a guest such as a busybox initramfs needs none.
	File    string `json:"file,omitempty"`
	Volume  string `json:"volume,omitempty"`
	Kernel  string `json:"kernel,omitempty"`
	Initrd  string `json:"initrd,omitempty"`
	Cmdline string `json:"cmdline,omitempty"`
	// OpenStack names the Glance image in OpenStack regions.
	OpenStack *OpenStackRef `json:"openstack,omitempty"`
}

// DiskGiB is the size of a flavor's disk of diskGB (10^9 bytes) in whole GiB (2^30 bytes),
// rounded down: what an image made of such a disk says it needs, so that a flavor with the
// same disk holds it by the catalogue's rule (an image's GiB fit in a flavor's GB).
func DiskGiB(diskGB int64) int64 { return diskGB * 1_000_000_000 >> 30 }

// OfferedIn reports whether the flavor is offered in the region.
func (f *Flavor) OfferedIn(region string) bool { return contains(f.Regions, region) }

// OfferedIn reports whether the image is offered in the region.
func (i *Image) OfferedIn(region string) bool { return contains(i.Regions, region) }

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
