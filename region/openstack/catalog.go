package openstack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/rules"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/computeql/computeql/region"
)

// The owner Describe gives every network: not valid catalogue ids (upper case), so that a
// catalogue in which the operator did not replace them fails to load, naming each network.
const (
	PlaceholderOrganization = "ORGANIZATION"
	PlaceholderProject      = "PROJECT"
)

// DescribeOptions say which cloud Describe lists.
type DescribeOptions struct {
	// Cloud is the cloud's name in clouds.yaml. Required.
	Cloud string
	// CloudsFile is the clouds.yaml to read; "" looks where OpenStack's tools look.
	CloudsFile string
	// RegionID is the catalogue id of the region; "" makes one of the cloud's name.
	RegionID string
	// RequestTimeout bounds each call to the cloud. Default: 30s, as the driver's.
	RequestTimeout time.Duration
}

// Describe lists what the cloud's project can use — public flavors, public images and its own, the
// networks it owns or shares with their IPv4 subnets, its security groups — as the catalogue
// entries of one OpenStack region, each naming the cloud's object by its "openstack"
// reference, for an operator to complete and edit: every network (and so every security
// group) is owned by PlaceholderOrganization and PlaceholderProject, and the catalogue has no
// organizations. It authenticates as the driver does, from clouds.yaml, and answers the
// driver's errors. The notes say what could not be described, and why.
func Describe(ctx context.Context, opts DescribeOptions) (cat *region.Catalog, notes []string, err error) {
	if opts.Cloud == "" {
		return nil, nil, errors.New("openstack: describe: no cloud named")
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = 30 * time.Second
	}
	regionID := opts.RegionID
	if regionID == "" {
		regionID = catalogID(opts.Cloud)
	}
	parse := []clouds.ParseOption{clouds.WithCloudName(opts.Cloud)}
	if opts.CloudsFile != "" {
		parse = append(parse, clouds.WithLocations(opts.CloudsFile))
	}
	auth, endpoint, _, err := clouds.Parse(parse...)
	if err != nil {
		return nil, nil, fmt.Errorf("openstack: describe cloud %q: %w", opts.Cloud, err)
	}
	// The driver's own session: its authentication, its 429 handling and its errors.
	d := &Driver{auth: auth, endpoint: endpoint, requestTimeout: opts.RequestTimeout, log: slog.Default()}
	s := describer{d: d, regionID: regionID, ids: map[string]bool{}}
	cat = &region.Catalog{
		Regions: []region.Region{{ID: regionID, Name: opts.Cloud, Driver: region.DriverOpenStack,
			OpenStack: &region.OpenStackRegion{Cloud: opts.Cloud}}},
		Organizations:             []region.Organization{},
		SSHCertificateAuthorities: []region.SSHCertificateAuthority{},
	}
	for _, step := range []func(context.Context, *region.Catalog) error{s.project, s.flavors, s.images, s.networks, s.securityGroups} {
		if err := step(ctx, cat); err != nil {
			return nil, nil, fmt.Errorf("openstack: describe cloud %q: %w", opts.Cloud, err)
		}
	}
	return cat, s.notes, nil
}

// describer lists one cloud into catalogue entries.
type describer struct {
	d         *Driver
	regionID  string
	projectID string
	// ids are the catalogue ids given so far, of every kind, so that none is given twice.
	ids   map[string]bool
	notes []string
}

func (s *describer) note(format string, args ...any) {
	s.notes = append(s.notes, fmt.Sprintf(format, args...))
}

// id is a catalogue id made of a cloud object's name, or of its cloud id when it has none,
// unique among those given.
func (s *describer) id(name, cloudID string) string {
	base := catalogID(name)
	if base == "" {
		base = catalogID(cloudID)
	}
	id := base
	for n := 2; s.ids[id]; n++ {
		suffix := "-" + strconv.Itoa(n)
		id = base[:min(len(base), maxIDLen-len(suffix))] + suffix
	}
	s.ids[id] = true
	return id
}

// maxIDLen is the catalogue's longest id.
const maxIDLen = 63

var notIDChars = regexp.MustCompile(`[^a-z0-9._-]+`)

// catalogID is a name as a catalogue id: lower case, runs of other characters as '-', starting
// with a letter or digit; "" when nothing of it is left.
func catalogID(name string) string {
	id := notIDChars.ReplaceAllString(strings.ToLower(name), "-")
	id = strings.TrimLeft(id, "._-")
	return strings.TrimRight(id[:min(len(id), maxIDLen)], "._-")
}

// project finds the project the session is scoped to, whose networks and security groups
// are listed.
func (s *describer) project(ctx context.Context, _ *region.Catalog) error {
	c, err := s.d.session(ctx)
	if err != nil {
		return err
	}
	res, ok := c.compute.ProviderClient.GetAuthResult().(tokens.CreateResult)
	if !ok {
		return errors.New("the cloud's authentication answered no Keystone v3 token")
	}
	p, err := res.ExtractProject()
	if err != nil || p == nil {
		return fmt.Errorf("the cloud's token is scoped to no project (%v): clouds.yaml must name one", err)
	}
	s.projectID = p.ID
	return nil
}

// flavors are Nova's public flavors. Nova's RAM is MiB and its disk GiB; both are rounded up
// to the catalogue's GiB and GB, so that the catalogue never refuses an image that Nova would
// boot on the flavor (Nova checks again at create).
func (s *describer) flavors(ctx context.Context, cat *region.Catalog) error {
	var list []flavors.Flavor
	err := s.d.call(ctx, "list flavors", func(ctx context.Context, c *clients) error {
		pages, err := flavors.ListDetail(c.compute, flavors.ListOpts{}).AllPages(ctx)
		if err == nil {
			list, err = flavors.ExtractFlavors(pages)
		}
		return err
	})
	if err != nil {
		return err
	}
	for _, f := range list {
		if f.Disk <= 0 {
			s.note("flavor %s (%s) left out: no disk of its own (it boots from a volume, which the driver does not make)", f.Name, f.ID)
			continue
		}
		cat.Flavors = append(cat.Flavors, region.Flavor{
			ID: s.id(f.Name, f.ID), Name: f.Name, CPUs: int64(f.VCPUs),
			MemoryGiB:    ceilDiv(int64(f.RAM), 1024),
			DiskGB:       ceilDiv(int64(f.Disk)<<30, 1_000_000_000),
			Architecture: region.ArchitectureX86_64,
			Regions:      []string{s.regionID}, OpenStack: &region.OpenStackRef{ID: f.ID},
		})
	}
	return nil
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// images are the Glance images public to all and the project's own; an active one is ready,
// any other pending. An image another project shares with it is left out: an admin's list
// cannot tell it from one shared with someone else.
func (s *describer) images(ctx context.Context, cat *region.Catalog) error {
	var list []images.Image
	err := s.d.call(ctx, "list images", func(ctx context.Context, c *clients) error {
		image, err := openstack.NewImageV2(c.compute.ProviderClient, s.d.endpoint)
		if err != nil {
			return err
		}
		pages, err := images.List(image, images.ListOpts{}).AllPages(ctx)
		if err == nil {
			list, err = images.ExtractImages(pages)
		}
		return err
	})
	if err != nil {
		return err
	}
	// Kernels and ramdisks that other images boot with are no images of servers.
	bootFiles := map[string]bool{}
	for _, im := range list {
		for _, key := range []string{"kernel_id", "ramdisk_id"} {
			if id, ok := im.Properties[key].(string); ok && id != "" {
				bootFiles[id] = true
			}
		}
	}
	for _, im := range list {
		// An admin's list holds every project's images: those of other projects are theirs.
		if im.Owner != s.projectID && im.Visibility != images.ImageVisibilityPublic && im.Visibility != images.ImageVisibilityCommunity {
			continue
		}
		if im.DiskFormat == "aki" || im.DiskFormat == "ari" || bootFiles[im.ID] {
			s.note("image %s (%s) left out: a kernel or ramdisk that other images boot with, not a server's image", im.Name, im.ID)
			continue
		}
		if property(&im, metaOrg) != "" {
			s.note("image %s (%s) left out: a snapshot of project %s/%s, listed to that project", im.Name, im.ID, property(&im, metaOrg), property(&im, metaProject))
			continue
		}
		arch := region.ArchitectureX86_64
		if a, ok := im.Properties["architecture"].(string); ok && a != "" {
			switch region.Architecture(a) {
			case region.ArchitectureX86_64, region.ArchitectureAArch64:
				arch = region.Architecture(a)
			default:
				s.note("image %s (%s) left out: architecture %q is not x86_64 or aarch64", im.Name, im.ID, a)
				continue
			}
		}
		state := region.ImageStatePending
		if im.Status == images.ImageStatusActive {
			state = region.ImageStateReady
		}
		cat.Images = append(cat.Images, region.Image{
			ID: s.id(im.Name, im.ID), Name: im.Name, Architecture: arch,
			SizeGiB:        max(ceilDiv(im.SizeBytes, 1<<30), int64(im.MinDiskGigabytes), 1),
			Virtualization: region.VirtualizationAny, State: state,
			Regions: []string{s.regionID}, OpenStack: &region.OpenStackRef{ID: im.ID},
		})
	}
	return nil
}

// networks are the project's own and the shared Neutron networks, each with its IPv4 subnet
// as the prefix; the driver makes ports on a network, and the catalogue gives one prefix.
func (s *describer) networks(ctx context.Context, cat *region.Catalog) error {
	var nets []networks.Network
	var subs []subnets.Subnet
	err := s.d.call(ctx, "list networks", func(ctx context.Context, c *clients) error {
		pages, err := networks.List(c.network, networks.ListOpts{}).AllPages(ctx)
		if err != nil {
			return err
		}
		if nets, err = networks.ExtractNetworks(pages); err != nil {
			return err
		}
		pages, err = subnets.List(c.network, subnets.ListOpts{IPVersion: 4}).AllPages(ctx)
		if err != nil {
			return err
		}
		subs, err = subnets.ExtractSubnets(pages)
		return err
	})
	if err != nil {
		return err
	}
	for _, n := range nets {
		if n.ProjectID != s.projectID && !n.Shared {
			continue
		}
		var prefixes []netip.Prefix
		for _, sn := range subs {
			if sn.NetworkID != n.ID {
				continue
			}
			p, err := netip.ParsePrefix(sn.CIDR)
			if err != nil {
				s.note("network %s (%s): subnet %s has CIDR %q: %v", n.Name, n.ID, sn.ID, sn.CIDR, err)
				continue
			}
			prefixes = append(prefixes, p.Masked())
		}
		if len(prefixes) == 0 {
			s.note("network %s (%s) left out: no IPv4 subnet", n.Name, n.ID)
			continue
		}
		if len(prefixes) > 1 {
			s.note("network %s (%s) has %d IPv4 subnets; its prefix is the first, %s", n.Name, n.ID, len(prefixes), prefixes[0])
		}
		cat.Networks = append(cat.Networks, region.Network{
			ID: s.id(n.Name, n.ID), Name: n.Name,
			OrganizationID: PlaceholderOrganization, ProjectID: PlaceholderProject,
			Region: s.regionID, Prefix: prefixes[0], OpenStack: &region.OpenStackRef{ID: n.ID},
		})
	}
	return nil
}

// securityGroups are the project's Neutron security groups, one catalogue group on each
// network (a catalogue group sits on one network, a Neutron group on any port), with the
// group's IPv4 rules as the catalogue's rules, which the API shows.
func (s *describer) securityGroups(ctx context.Context, cat *region.Catalog) error {
	var list []groups.SecGroup
	err := s.d.call(ctx, "list security groups", func(ctx context.Context, c *clients) error {
		pages, err := groups.List(c.network, groups.ListOpts{ProjectID: s.projectID}).AllPages(ctx)
		if err == nil {
			list, err = groups.ExtractGroups(pages)
		}
		return err
	})
	if err != nil {
		return err
	}
	cat.SecurityGroups = []region.SecurityGroup{}
	for _, g := range list {
		rs := s.rules(g)
		for _, n := range cat.Networks {
			cat.SecurityGroups = append(cat.SecurityGroups, region.SecurityGroup{
				ID: s.id(n.ID+"-"+g.Name, g.ID), Name: g.Name, NetworkID: n.ID, Rules: rs,
				OpenStack: &region.OpenStackRef{ID: g.ID},
			})
		}
	}
	return nil
}

// rules are a Neutron group's IPv4 rules as the catalogue writes them; a rule whose other end
// is a group, or of a protocol the catalogue has no name for, is left out with a note.
func (s *describer) rules(g groups.SecGroup) []region.SecurityGroupRule {
	out := []region.SecurityGroupRule{}
	for _, r := range g.Rules {
		if r.EtherType != string(rules.EtherType4) {
			continue
		}
		if r.RemoteGroupID != "" {
			s.note("security group %s (%s): rule %s left out: its other end is group %s, which the catalogue cannot name",
				g.Name, g.ID, r.ID, r.RemoteGroupID)
			continue
		}
		rule := region.SecurityGroupRule{Direction: region.RuleDirection(r.Direction), RemotePrefix: r.RemoteIPPrefix}
		switch r.Protocol {
		case "", "any":
			rule.Protocol = region.ProtocolAny
		case "tcp", "udp":
			rule.Protocol = region.RuleProtocol(r.Protocol)
			rule.PortMin, rule.PortMax = r.PortRangeMin, r.PortRangeMax
		case "icmp":
			rule.Protocol = region.ProtocolICMP
		default:
			s.note("security group %s (%s): rule %s left out: protocol %q is not tcp, udp, icmp or any", g.Name, g.ID, r.ID, r.Protocol)
			continue
		}
		out = append(out, rule)
	}
	// Neutron lists a group's rules in no particular order: sorted, the same group prints the
	// same.
	slices.SortFunc(out, func(a, b region.SecurityGroupRule) int {
		return cmp.Or(cmp.Compare(a.Direction, b.Direction), cmp.Compare(a.Protocol, b.Protocol),
			cmp.Compare(a.PortMin, b.PortMin), cmp.Compare(a.PortMax, b.PortMax), cmp.Compare(a.RemotePrefix, b.RemotePrefix))
	})
	return out
}
