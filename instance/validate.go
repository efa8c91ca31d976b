package instance

import (
	"bytes"
	"encoding/base64"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/computeql/computeql/region"
)

// Limits on free-form input. They keep a single instance record small (it is read on every
// reconcile and event) and are documented in the schema and README.
const (
	// MaxUserDataBytes caps decoded user data; clouds allow 16 to 64 KiB and cloud-init
	// handles this comfortably.
	MaxUserDataBytes = 32 << 10
	MaxDescription   = 1024
	MaxTags          = 50
	MaxTagName       = 63
	MaxTagValue      = 255
	MaxSecurityGroup = 16
	MaxSourceCIDRs   = 64
)

// ReservedTagPrefix marks tags the system sets on servers and images (e.g. the link from a
// server to its instance). Users may not set them, so the link cannot be forged.
const ReservedTagPrefix = "compute/"

// namePattern is the instance name rule: the name becomes the hostname.
var namePattern = regexp.MustCompile(`^[0-9A-Za-z](?:[0-9A-Za-z-_.]{0,61}[0-9A-Za-z])?$`)

func checkName(p *problems, name string) {
	if !namePattern.MatchString(name) {
		p.add(CodeBadUserInput, path("name"),
			"name must be 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
	}
}

func checkDescription(p *problems, d string) {
	if utf8.RuneCountInString(d) > MaxDescription {
		p.add(CodeBadUserInput, path("description"), "description is longer than %d characters", MaxDescription)
	}
}

func checkTags(p *problems, tags []Tag) {
	if len(tags) > MaxTags {
		p.add(CodeBadUserInput, path("tags"), "at most %d tags are allowed", MaxTags)
		return
	}
	seen := map[string]bool{}
	for i, t := range tags {
		f := path("tags", strconv.Itoa(i), "name")
		switch {
		case t.Name == "" || utf8.RuneCountInString(t.Name) > MaxTagName:
			p.add(CodeBadUserInput, f, "tag name must be 1 to %d characters", MaxTagName)
		case strings.HasPrefix(t.Name, ReservedTagPrefix):
			p.add(CodeBadUserInput, f, "tag names starting with %q are reserved", ReservedTagPrefix)
		case seen[t.Name]:
			p.add(CodeBadUserInput, f, "tag %q is given more than once", t.Name)
		}
		seen[t.Name] = true
		if utf8.RuneCountInString(t.Value) > MaxTagValue {
			p.add(CodeBadUserInput, path("tags", strconv.Itoa(i), "value"), "tag value is longer than %d characters", MaxTagValue)
		}
	}
}

// checkFlavor resolves the flavor and checks that the region offers it; it returns nil when the
// flavor cannot be used. regionID is "" when the network is unknown.
func checkFlavor(p *problems, cat *region.Catalog, id, regionID string) *region.Flavor {
	f, ok := cat.Flavor(id)
	switch {
	case !ok:
		p.add(CodeNotFound, path("flavorId"), "flavor %q not found", id)
		return nil
	case regionID != "" && !f.OfferedIn(regionID):
		p.add(CodeUnprocessable, path("flavorId"), "flavor %q is not offered in region %q", id, regionID)
		return nil
	}
	return f
}

// checkCompatible applies the architecture, disk size and virtualization rules to a flavor
// and image that both exist.
func checkCompatible(p *problems, f *region.Flavor, img *region.Image) {
	if f.Architecture != img.Architecture {
		p.add(CodeUnprocessable, path("imageId"), "image %q is %s but flavor %q is %s",
			img.ID, img.Architecture, f.ID, f.Architecture)
	}
	// Flavor disks are sold in GB (10^9 bytes) and images measured in GiB (2^30 bytes):
	// comparing the raw numbers would accept a 20 GiB image on a 20 GB disk that cannot hold it.
	if need, have := img.SizeGiB<<30, f.DiskGB*1_000_000_000; need > have {
		p.add(CodeUnprocessable, path("imageId"), "image %q needs %d GiB of disk (%.1f GB) but flavor %q has %d GB",
			img.ID, img.SizeGiB, float64(need)/1e9, f.ID, f.DiskGB)
	}
	switch {
	case img.Virtualization == region.VirtualizationBaremetal && !f.Baremetal:
		p.add(CodeUnprocessable, path("imageId"), "image %q runs only on baremetal flavors and flavor %q is virtualized", img.ID, f.ID)
	case img.Virtualization == region.VirtualizationVirtualized && f.Baremetal:
		p.add(CodeUnprocessable, path("imageId"), "image %q runs only on virtualized flavors and flavor %q is baremetal", img.ID, f.ID)
	}
}

// checkRegionOffers refuses what the region's kind of hosts cannot give: a libvirt region has
// neither GPUs, bare metal nor public addresses. regionID is "" when the network is unknown and
// flavor nil when unusable; both were reported already.
func checkRegionOffers(p *problems, cat *region.Catalog, regionID string, flavor *region.Flavor, publicIP bool) {
	r, ok := cat.Region(regionID)
	if !ok {
		return
	}
	if flavor != nil {
		if why := r.RunsFlavor(flavor); why != "" {
			p.add(CodeUnprocessable, path("flavorId"), "region %q cannot run flavor %q: %s", r.ID, flavor.ID, why)
		}
	}
	if publicIP && !r.OffersPublicIPs() {
		p.add(CodeUnprocessable, path("networking", "publicIP"), "region %q offers no public IP addresses", r.ID)
	}
}

// checkNetworking validates security groups (on the network, no duplicates) and source CIDRs,
// and returns the networking with CIDRs in canonical form. network is nil when unknown; a
// group is then still one of a network of the organization's project, so that a group of
// another tenant answers as one that does not exist, whatever else is wrong.
func checkNetworking(p *problems, cat *region.Catalog, n Networking, org, project string, network *region.Network) Networking {
	if len(n.SecurityGroupIDs) > MaxSecurityGroup {
		p.add(CodeBadUserInput, path("networking", "securityGroupIds"), "at most %d security groups are allowed", MaxSecurityGroup)
	} else {
		seen := map[string]bool{}
		for i, id := range n.SecurityGroupIDs {
			f := path("networking", "securityGroupIds", strconv.Itoa(i))
			if seen[id] {
				p.add(CodeBadUserInput, f, "security group %q is given more than once", id)
				continue
			}
			seen[id] = true
			if !groupOf(cat, id, org, project, network) {
				p.add(CodeNotFound, f, "security group %q not found on the instance's network", id)
			}
		}
	}
	out := n
	out.AllowedSourceAddresses = nil
	if len(n.AllowedSourceAddresses) > MaxSourceCIDRs {
		p.add(CodeBadUserInput, path("networking", "allowedSourceAddresses"), "at most %d source addresses are allowed", MaxSourceCIDRs)
		return out
	}
	for i, s := range n.AllowedSourceAddresses {
		prefix, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			p.add(CodeBadUserInput, path("networking", "allowedSourceAddresses", strconv.Itoa(i)),
				"%q is not a CIDR such as 203.0.113.0/24 or 2001:db8::/32", s)
			continue
		}
		out.AllowedSourceAddresses = append(out.AllowedSourceAddresses, prefix.Masked().String())
	}
	return out
}

// groupOf reports whether the security group exists on a network of the organization's
// project, and on network when it is known.
func groupOf(cat *region.Catalog, id, org, project string, network *region.Network) bool {
	sg, ok := cat.SecurityGroup(id)
	if !ok {
		return false
	}
	if network != nil {
		return sg.NetworkID == network.ID
	}
	n, ok := cat.Network(sg.NetworkID)
	return ok && n.OrganizationID == org && n.ProjectID == project
}

// checkSSHCA checks that the certificate authority belongs to the instance's organization and
// project; any other is reported as not found so that ids of other tenants do not leak.
func checkSSHCA(p *problems, cat *region.Catalog, id, org, project string) {
	ca, ok := cat.SSHCertificateAuthority(id)
	if !ok || ca.OrganizationID != org || ca.ProjectID != project {
		p.add(CodeNotFound, path("sshCertificateAuthorityId"), "SSH certificate authority %q not found in project %q", id, project)
	}
}

// cloudInitPrefixes are the first-line markers cloud-init recognises for its part types.
var cloudInitPrefixes = []string{
	"#cloud-config", // also #cloud-config-archive
	"#!",
	"#cloud-boothook",
	"#include", // also #include-once
	"#part-handler",
	"## template: jinja",
}

// decodeUserData decodes base64 user data and checks that cloud-init will recognise it.
// withCA says an SSH CA is attached: its managed injection cannot merge into gzip.
func decodeUserData(p *problems, encoded string, withCA bool) []byte {
	f := path("userData")
	// A cheap bound before decoding; it leaves room for line breaks, which the decoder skips.
	if len(encoded) > 2*base64.StdEncoding.EncodedLen(MaxUserDataBytes) {
		p.add(CodeBadUserInput, f, "user data is larger than %d bytes", MaxUserDataBytes)
		return nil
	}
	data, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		p.add(CodeBadUserInput, f, "user data is not valid base64: %v", err)
		return nil
	}
	if len(data) > MaxUserDataBytes {
		p.add(CodeBadUserInput, f, "user data is larger than %d bytes", MaxUserDataBytes)
		return nil
	}
	if len(data) == 0 {
		return nil
	}
	if isGzip(data) {
		if withCA {
			p.add(CodeUnprocessable, f, "gzip user data cannot be used with an SSH certificate authority, whose configuration is merged into the user data")
			return nil
		}
		return data
	}
	first, _, _ := bytes.Cut(data, []byte("\n"))
	first = bytes.TrimSuffix(first, []byte("\r"))
	lower := strings.ToLower(string(first))
	if strings.HasPrefix(lower, "content-type: multipart/") || strings.HasPrefix(lower, "mime-version:") {
		return data
	}
	for _, prefix := range cloudInitPrefixes {
		if strings.HasPrefix(string(first), prefix) {
			return data
		}
	}
	p.add(CodeBadUserInput, f, "user data is not recognisable cloud-init: it must be MIME multipart, gzip, or start with #cloud-config, #!, #cloud-boothook, #include, #part-handler or ## template: jinja")
	return nil
}

func isGzip(b []byte) bool { return bytes.HasPrefix(b, []byte{0x1f, 0x8b}) }
