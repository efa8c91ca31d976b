package region

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/computeql/computeql/quota"
)

// Catalog is a validated catalogue. Get one from Parse, Load or Demo: they check every
// cross-reference and build the lookup indexes. Treat it as read-only once built, since the
// lookups hand out pointers into its slices and the demo catalogue is shared by all callers.
type Catalog struct {
	Regions                   []Region                  `json:"regions"`
	Organizations             []Organization            `json:"organizations"`
	Networks                  []Network                 `json:"networks"`
	SecurityGroups            []SecurityGroup           `json:"securityGroups"`
	SSHCertificateAuthorities []SSHCertificateAuthority `json:"sshCertificateAuthorities"`
	Flavors                   []Flavor                  `json:"flavors"`
	Images                    []Image                   `json:"images"`

	// Indexes map an id to its position in the matching slice. They hold positions rather
	// than pointers so a lookup always returns the element that is in the slice now.
	regionIdx        map[string]int
	organizationIdx  map[string]int
	networkIdx       map[string]int
	securityGroupIdx map[string]int
	sshCAIdx         map[string]int
	flavorIdx        map[string]int
	imageIdx         map[string]int
	// projects holds, per organization id, the set of its project ids.
	projects map[string]map[string]bool
}

// idPattern is deliberately narrow: ids are embedded in Redis keys and hash tags, so
// braces, colons, whitespace and upper case (which would alias on case-folding) are refused.
var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// Parse decodes and validates a catalogue in JSON form. Unknown fields are refused so a
// misspelt key fails loudly instead of silently taking its zero value. Organizations that
// leave quota kinds out get quota.DefaultLimits for them. Every problem found is reported,
// joined with errors.Join, each naming the entry at fault.
func Parse(data []byte) (*Catalog, error) { return parse(data, "") }

// parse is Parse with relative image paths (file, kernel, initrd) taken from dir, the
// catalogue file's directory; with no dir they are refused.
func parse(data []byte, dir string) (*Catalog, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c Catalog
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("catalog: decode: %w", err)
	}
	// A second document after the first is almost certainly a botched edit or concatenation.
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("catalog: decode: unexpected data after the catalogue object")
	}
	c.applyDefaults()
	if dir != "" {
		c.resolvePaths(dir)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Load reads the catalogue file at path and parses it with Parse, except that relative image
// paths are taken from the file's directory, so a catalogue can sit beside its images.
func Load(path string) (*Catalog, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load catalog %s: %w", path, err)
	}
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("load catalog %s: %w", path, err)
	}
	c, err := parse(data, dir)
	if err != nil {
		return nil, fmt.Errorf("load catalog %s: %w", path, err)
	}
	return c, nil
}

//go:embed demo.json
var demoJSON []byte

var demo = sync.OnceValue(func() *Catalog {
	c, err := Parse(demoJSON)
	if err != nil {
		// A test parses demo.json, so this only fires if that test was ignored.
		panic(fmt.Sprintf("region: embedded demo catalogue is invalid: %v", err))
	}
	return c
})

// Demo returns the built-in demo catalogue. It is parsed once and shared, so callers must
// not modify it.
func Demo() *Catalog { return demo() }

// Region returns the region with the given id.
func (c *Catalog) Region(id string) (*Region, bool) {
	return lookup(c.Regions, c.regionIdx, id, func(r *Region) string { return r.ID })
}

// Organization returns the organization with the given id.
func (c *Catalog) Organization(id string) (*Organization, bool) {
	return lookup(c.Organizations, c.organizationIdx, id, func(o *Organization) string { return o.ID })
}

// Network returns the network with the given id.
func (c *Catalog) Network(id string) (*Network, bool) {
	return lookup(c.Networks, c.networkIdx, id, func(n *Network) string { return n.ID })
}

// SecurityGroup returns the security group with the given id.
func (c *Catalog) SecurityGroup(id string) (*SecurityGroup, bool) {
	return lookup(c.SecurityGroups, c.securityGroupIdx, id, func(s *SecurityGroup) string { return s.ID })
}

// SSHCertificateAuthority returns the SSH certificate authority with the given id.
func (c *Catalog) SSHCertificateAuthority(id string) (*SSHCertificateAuthority, bool) {
	return lookup(c.SSHCertificateAuthorities, c.sshCAIdx, id, func(a *SSHCertificateAuthority) string { return a.ID })
}

// Flavor returns the flavor with the given id.
func (c *Catalog) Flavor(id string) (*Flavor, bool) {
	return lookup(c.Flavors, c.flavorIdx, id, func(f *Flavor) string { return f.ID })
}

// Image returns the image with the given id.
func (c *Catalog) Image(id string) (*Image, bool) {
	return lookup(c.Images, c.imageIdx, id, func(i *Image) string { return i.ID })
}

// HasProject reports whether the organization exists and has the project.
func (c *Catalog) HasProject(orgID, projectID string) bool {
	if c.projects != nil {
		return c.projects[orgID][projectID]
	}
	o, ok := c.Organization(orgID)
	if !ok {
		return false
	}
	for i := range o.Projects {
		if o.Projects[i].ID == projectID {
			return true
		}
	}
	return false
}

// lookup uses the index when Parse built one and scans otherwise, so a Catalog written as
// a literal (as tests elsewhere may do) still answers lookups correctly.
func lookup[T any](s []T, idx map[string]int, id string, idOf func(*T) string) (*T, bool) {
	if idx != nil {
		i, ok := idx[id]
		if !ok || i >= len(s) {
			return nil, false
		}
		return &s[i], true
	}
	for i := range s {
		if idOf(&s[i]) == id {
			return &s[i], true
		}
	}
	return nil, false
}

func (c *Catalog) resolvePaths(dir string) {
	for i := range c.Images {
		im := &c.Images[i]
		for _, p := range []*string{&im.File, &im.Kernel, &im.Initrd} {
			if *p != "" && !filepath.IsAbs(*p) {
				*p = filepath.Join(dir, *p)
			}
		}
	}
}

func (c *Catalog) applyDefaults() {
	for i := range c.Regions {
		r := &c.Regions[i]
		if r.Driver == "" {
			r.Driver = DriverSim
		}
		if l := r.Libvirt; l != nil {
			if l.Pool == "" {
				l.Pool = "computeql"
			}
			if l.PoolPath == "" {
				l.PoolPath = "/var/lib/libvirt/images/" + l.Pool
			}
			if l.Accel == "" {
				l.Accel = AccelAuto
			}
			if l.StopTimeout == "" {
				l.StopTimeout = "60s"
			}
			if l.BuildTimeout == "" {
				l.BuildTimeout = "10m"
			}
		}
		openStackDefaults(r.OpenStack)
	}
	for i := range c.Organizations {
		o := &c.Organizations[i]
		if o.Quota == nil {
			o.Quota = quota.Amounts{}
		}
		for k, v := range quota.DefaultLimits() {
			if _, set := o.Quota[k]; !set {
				o.Quota[k] = v
			}
		}
	}
}

// problems collects validation errors so that one pass reports all of them: fixing a
// catalogue one error per run is tedious.
type problems []error

func (p *problems) add(entry, format string, args ...any) {
	*p = append(*p, fmt.Errorf("catalog: %s: %s", entry, fmt.Sprintf(format, args...)))
}

func entry(kind string, i int, id string) string {
	return fmt.Sprintf("%s[%d] %q", kind, i, id)
}

// index checks ids and names of one kind of entry and maps each id to its first position;
// later duplicates are reported and left out so references resolve to the first.
func index[T any](p *problems, kind string, s []T, idName func(*T) (string, string)) map[string]int {
	idx := make(map[string]int, len(s))
	for i := range s {
		id, name := idName(&s[i])
		e := entry(kind, i, id)
		checkIDName(p, e, id, name)
		if j, dup := idx[id]; dup {
			p.add(e, "duplicate id (also %s[%d])", kind, j)
			continue
		}
		idx[id] = i
	}
	return idx
}

func checkIDName(p *problems, e, id, name string) {
	if !idPattern.MatchString(id) {
		p.add(e, "invalid id: must match %s", idPattern)
	}
	if name == "" {
		p.add(e, "name is empty")
	}
}

func (c *Catalog) validate() error {
	var p problems

	c.regionIdx = index(&p, "regions", c.Regions, func(r *Region) (string, string) { return r.ID, r.Name })
	c.organizationIdx = index(&p, "organizations", c.Organizations, func(o *Organization) (string, string) { return o.ID, o.Name })
	c.networkIdx = index(&p, "networks", c.Networks, func(n *Network) (string, string) { return n.ID, n.Name })
	c.securityGroupIdx = index(&p, "securityGroups", c.SecurityGroups, func(s *SecurityGroup) (string, string) { return s.ID, s.Name })
	c.sshCAIdx = index(&p, "sshCertificateAuthorities", c.SSHCertificateAuthorities, func(a *SSHCertificateAuthority) (string, string) { return a.ID, a.Name })
	c.flavorIdx = index(&p, "flavors", c.Flavors, func(f *Flavor) (string, string) { return f.ID, f.Name })
	c.imageIdx = index(&p, "images", c.Images, func(i *Image) (string, string) { return i.ID, i.Name })

	for i := range c.Regions {
		validateRegion(&p, i, &c.Regions[i])
	}
	c.projects = make(map[string]map[string]bool, len(c.Organizations))
	for i := range c.Organizations {
		c.validateOrganization(&p, i)
	}
	for i := range c.Networks {
		c.validateNetwork(&p, i)
	}
	for i := range c.SecurityGroups {
		sg := &c.SecurityGroups[i]
		if _, ok := c.networkIdx[sg.NetworkID]; !ok {
			p.add(entry("securityGroups", i, sg.ID), "unknown network %q", sg.NetworkID)
		}
		for j := range sg.Rules {
			validateRule(&p, fmt.Sprintf("%s rules[%d]", entry("securityGroups", i, sg.ID), j), &sg.Rules[j])
		}
		if n, ok := c.Network(sg.NetworkID); ok {
			c.checkOpenStackRef(&p, entry("securityGroups", i, sg.ID), sg.OpenStack, n.Region)
		}
	}
	for i := range c.SSHCertificateAuthorities {
		ca := &c.SSHCertificateAuthorities[i]
		e := entry("sshCertificateAuthorities", i, ca.ID)
		c.checkOwner(&p, e, ca.OrganizationID, ca.ProjectID)
		if ca.PublicKey == "" {
			p.add(e, "publicKey is empty")
		}
	}
	for i := range c.Flavors {
		c.validateFlavor(&p, i)
	}
	for i := range c.Images {
		c.validateImage(&p, i)
	}

	return errors.Join(p...)
}

// validateRule checks a security group rule and puts its remote prefix in canonical form.
func validateRule(p *problems, e string, r *SecurityGroupRule) {
	switch r.Direction {
	case DirectionIngress, DirectionEgress:
	default:
		p.add(e, "direction %q is not ingress or egress", r.Direction)
	}
	switch r.Protocol {
	case ProtocolTCP, ProtocolUDP:
		switch {
		case r.PortMin == 0 && r.PortMax == 0:
		case r.PortMin < 1 || r.PortMax > 65535 || r.PortMin > r.PortMax:
			p.add(e, "ports %d-%d are not a range within 1-65535", r.PortMin, r.PortMax)
		}
	case ProtocolICMP, ProtocolAny:
		if r.PortMin != 0 || r.PortMax != 0 {
			p.add(e, "protocol %s has no ports", r.Protocol)
		}
	default:
		p.add(e, "protocol %q is not tcp, udp, icmp or any", r.Protocol)
	}
	if r.RemotePrefix == "" {
		r.RemotePrefix = "0.0.0.0/0"
	}
	prefix, err := netip.ParsePrefix(r.RemotePrefix)
	if err != nil || !prefix.Addr().Is4() {
		p.add(e, "remotePrefix %q is not an IPv4 prefix such as 10.0.0.0/8", r.RemotePrefix)
		return
	}
	r.RemotePrefix = prefix.Masked().String()
}

// volumeName is what a libvirt pool accepts as a volume name without surprises.
var volumeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func validateRegion(p *problems, i int, r *Region) {
	e := entry("regions", i, r.ID)
	if r.Driver == DriverOpenStack {
		validateOpenStackRegion(p, e, r)
		return
	}
	if r.OpenStack != nil {
		p.add(e, "openstack settings given, but the driver is %q", r.Driver)
	}
	switch r.Driver {
	case DriverSim:
		if r.Libvirt != nil {
			p.add(e, "libvirt settings given, but the driver is %q", r.Driver)
		}
	case DriverLibvirt:
		l := r.Libvirt
		if l == nil {
			p.add(e, `driver "libvirt" needs "libvirt": {"uri": ...}`)
			return
		}
		validateLibvirtHosts(p, e, l)
		if !volumeName.MatchString(l.Pool) {
			p.add(e, "libvirt: pool %q: want letters, digits, '.', '_' and '-'", l.Pool)
		}
		if !filepath.IsAbs(l.PoolPath) {
			p.add(e, "libvirt: poolPath %q is not an absolute path", l.PoolPath)
		}
		switch l.Accel {
		case AccelAuto, AccelKVM, AccelTCG:
		default:
			p.add(e, "libvirt: unknown accel %q (want auto, kvm or tcg)", l.Accel)
		}
		if d, err := time.ParseDuration(l.StopTimeout); err != nil || d <= 0 {
			p.add(e, "libvirt: stopTimeout %q is not a positive duration such as 60s", l.StopTimeout)
		}
		if d, err := time.ParseDuration(l.BuildTimeout); err != nil || d <= 0 {
			p.add(e, "libvirt: buildTimeout %q is not a positive duration such as 10m", l.BuildTimeout)
		}
	default:
		p.add(e, "unknown driver %q (want sim, libvirt or openstack)", r.Driver)
	}
}

// hostName is what a libvirt host's name may be: it goes into Redis keys and log fields.
var hostName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// validateLibvirtHosts checks that a libvirt region has one host by uri, or hosts by name, each
// reachable by a URI the driver speaks, none named or reached twice.
func validateLibvirtHosts(p *problems, e string, l *LibvirtRegion) {
	switch {
	case l.URI != "" && len(l.Hosts) > 0:
		p.add(e, `libvirt: give "uri" for a region of one host or "hosts" for several, not both`)
		return
	case l.URI == "" && len(l.Hosts) == 0:
		p.add(e, `libvirt: "uri" (one host) or "hosts" (several) is missing`)
		return
	}
	names, uris := map[string]bool{}, map[string]bool{}
	for i, h := range l.HostList() {
		where := "libvirt: "
		if len(l.Hosts) > 0 {
			where = fmt.Sprintf("libvirt: hosts[%d] %q: ", i, h.Name)
		}
		if !hostName.MatchString(h.Name) {
			p.add(e, "%sname: want lower-case letters, digits and '-', at most 63", where)
		}
		if names[h.Name] {
			p.add(e, "%sduplicate host name", where)
		}
		names[h.Name] = true
		// Two spellings of one daemon (a default port given or not) are the same host.
		if u, err := ParseLibvirtURI(h.URI); err != nil {
			p.add(e, "%s%v", where, err)
		} else if daemon := u.Network + " " + u.Address + " " + u.SSH.Socket; uris[daemon] {
			p.add(e, "%suri %q names a host listed before", where, h.URI)
		} else {
			uris[daemon] = true
		}
		if len(l.Hosts) > 0 && l.Hosts[i].PoolPath != "" && !filepath.IsAbs(h.PoolPath) {
			p.add(e, "%spoolPath %q is not an absolute path", where, h.PoolPath)
		}
	}
}

func openStackDefaults(o *OpenStackRegion) {
	if o == nil {
		return
	}
	if o.RequestTimeout == "" {
		o.RequestTimeout = "30s"
	}
	if o.PollInterval == "" {
		o.PollInterval = "2s"
	}
}

// cloudName is what a clouds.yaml key can be without quoting surprises.
var cloudName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func validateOpenStackRegion(p *problems, e string, r *Region) {
	if r.Libvirt != nil {
		p.add(e, "libvirt settings given, but the driver is %q", r.Driver)
	}
	o := r.OpenStack
	if o == nil {
		p.add(e, `driver "openstack" needs "openstack": {"cloud": ...}, the cloud's name in clouds.yaml`)
		return
	}
	if !cloudName.MatchString(o.Cloud) {
		p.add(e, "openstack: cloud %q is not a clouds.yaml cloud name (letters, digits, '.', '_' and '-')", o.Cloud)
	}
	if d, err := time.ParseDuration(o.RequestTimeout); err != nil || d <= 0 {
		p.add(e, "openstack: requestTimeout %q is not a positive duration such as 30s", o.RequestTimeout)
	}
	if d, err := time.ParseDuration(o.PollInterval); err != nil || d <= 0 {
		p.add(e, "openstack: pollInterval %q is not a positive duration such as 2s", o.PollInterval)
	}
	// Neutron trims nothing: a name with spaces around it, or a line break, names no network.
	if x := o.ExternalNetwork; x != strings.TrimSpace(x) || strings.ContainsFunc(x, unicode.IsControl) {
		p.add(e, "openstack: externalNetwork %q is not a Neutron network id or name", x)
	}
}

// checkOpenStackRef checks the cloud object an entry names (by its id or its name, one of
// them), and that it names one only for an OpenStack region.
func (c *Catalog) checkOpenStackRef(p *problems, e string, ref *OpenStackRef, regions ...string) {
	if ref == nil {
		return
	}
	if (ref.ID == "") == (ref.Name == "") {
		p.add(e, "openstack: give the cloud's id or name of the object, one of them")
	}
	for _, id := range regions {
		if r, ok := c.Region(id); ok && r.Driver == DriverOpenStack {
			return
		}
	}
	p.add(e, "openstack settings given, but no OpenStack region offers it")
}

func (c *Catalog) validateOrganization(p *problems, i int) {
	o := &c.Organizations[i]
	e := entry("organizations", i, o.ID)
	projects := make(map[string]bool, len(o.Projects))
	for j := range o.Projects {
		pr := &o.Projects[j]
		pe := fmt.Sprintf("%s projects[%d] %q", e, j, pr.ID)
		checkIDName(p, pe, pr.ID, pr.Name)
		if projects[pr.ID] {
			p.add(pe, "duplicate project id")
			continue
		}
		projects[pr.ID] = true
	}
	// Only the first organization with an id owns its projects, matching the index.
	if c.organizationIdx[o.ID] == i {
		c.projects[o.ID] = projects
	}
	// Sorted so the messages come out in the same order on every run.
	for _, k := range slices.Sorted(maps.Keys(o.Quota)) {
		v := o.Quota[k]
		if _, err := quota.ParseKind(string(k)); err != nil {
			p.add(e, "quota: %v", err)
			continue
		}
		if v < 0 {
			p.add(e, "quota: %s limit %d is negative", k, v)
		}
	}
}

func (c *Catalog) validateNetwork(p *problems, i int) {
	n := &c.Networks[i]
	e := entry("networks", i, n.ID)
	c.checkOwner(p, e, n.OrganizationID, n.ProjectID)
	if _, ok := c.regionIdx[n.Region]; !ok {
		p.add(e, "unknown region %q", n.Region)
	}
	c.checkOpenStackRef(p, e, n.OpenStack, n.Region)
	switch pf := n.Prefix; {
	case !pf.IsValid():
		p.add(e, "prefix is missing or invalid")
	case !pf.Addr().Is4():
		p.add(e, "prefix %s is not IPv4", pf)
	case pf.Bits() < 8 || pf.Bits() > 30:
		// Below /8 is implausible for a tenant network; above /30 leaves no room for hosts
		// once network, broadcast and gateway addresses are taken.
		p.add(e, "prefix %s: length must be between 8 and 30", pf)
	case pf != pf.Masked():
		p.add(e, "prefix %s has host bits set (want %s)", pf, pf.Masked())
	}
}

// checkOwner reports an unknown organization, or an unknown project of a known one; a
// project is not checked against an organization that does not exist, to avoid a second,
// redundant message.
func (c *Catalog) checkOwner(p *problems, e, orgID, projectID string) {
	if _, ok := c.organizationIdx[orgID]; !ok {
		p.add(e, "unknown organization %q", orgID)
		return
	}
	if !c.projects[orgID][projectID] {
		p.add(e, "unknown project %q of organization %q", projectID, orgID)
	}
}

func (c *Catalog) validateFlavor(p *problems, i int) {
	f := &c.Flavors[i]
	e := entry("flavors", i, f.ID)
	if f.CPUs <= 0 {
		p.add(e, "cpus must be positive, got %d", f.CPUs)
	}
	if f.MemoryGiB <= 0 {
		p.add(e, "memoryGiB must be positive, got %d", f.MemoryGiB)
	}
	if f.DiskGB <= 0 {
		p.add(e, "diskGB must be positive, got %d", f.DiskGB)
	}
	checkArchitecture(p, e, f.Architecture)
	if g := f.GPU; g != nil {
		if g.PhysicalCount <= 0 {
			p.add(e, "gpu: physicalCount must be positive, got %d", g.PhysicalCount)
		}
		if g.MemoryGiB <= 0 {
			p.add(e, "gpu: memoryGiB must be positive, got %d", g.MemoryGiB)
		}
		if g.Vendor == "" {
			p.add(e, "gpu: vendor is empty")
		}
		if g.Model == "" {
			p.add(e, "gpu: model is empty")
		}
	}
	c.checkRegions(p, e, f.Regions)
	c.checkOpenStackRef(p, e, f.OpenStack, f.Regions...)
}

func (c *Catalog) validateImage(p *problems, i int) {
	im := &c.Images[i]
	e := entry("images", i, im.ID)
	checkArchitecture(p, e, im.Architecture)
	if im.SizeGiB <= 0 {
		p.add(e, "sizeGiB must be positive, got %d", im.SizeGiB)
	}
	switch im.Virtualization {
	case VirtualizationVirtualized, VirtualizationBaremetal, VirtualizationAny:
	default:
		p.add(e, "unknown virtualization %q (want virtualized, baremetal or any)", im.Virtualization)
	}
	switch im.State {
	case ImageStatePending, ImageStateCreating, ImageStateReady, ImageStateFailed:
	default:
		p.add(e, "unknown state %q (want pending, creating, ready or failed)", im.State)
	}
	c.checkRegions(p, e, im.Regions)
	c.checkOpenStackRef(p, e, im.OpenStack, im.Regions...)
	c.checkBoot(p, e, im)
}

// checkBoot checks what a libvirt region would boot for the image, when one offers it.
func (c *Catalog) checkBoot(p *problems, e string, im *Image) {
	libvirt := false
	for _, id := range im.Regions {
		if r, ok := c.Region(id); ok && r.Driver == DriverLibvirt {
			libvirt = true
		}
	}
	for _, f := range []struct{ name, path string }{{"file", im.File}, {"kernel", im.Kernel}, {"initrd", im.Initrd}} {
		if f.path != "" && !filepath.IsAbs(f.path) {
			p.add(e, "%s %q is not an absolute path", f.name, f.path)
		}
	}
	if im.Volume != "" && !volumeName.MatchString(im.Volume) {
		p.add(e, "volume %q: want letters, digits, '.', '_' and '-'", im.Volume)
	}
	switch {
	case im.File != "" && im.Volume != "":
		p.add(e, "give file or volume, not both")
	case im.Initrd != "" && im.Kernel == "":
		p.add(e, "initrd given without a kernel")
	case im.Cmdline != "" && im.Kernel == "":
		p.add(e, "cmdline given without a kernel")
	case libvirt && im.State == ImageStateReady && im.File == "" && im.Volume == "" && im.Kernel == "":
		p.add(e, "offered in a libvirt region: needs a file, a volume or a kernel to boot")
	}
}

func checkArchitecture(p *problems, e string, a Architecture) {
	switch a {
	case ArchitectureX86_64, ArchitectureAArch64:
	default:
		p.add(e, "unknown architecture %q (want x86_64 or aarch64)", a)
	}
}

func (c *Catalog) checkRegions(p *problems, e string, regions []string) {
	if len(regions) == 0 {
		p.add(e, "regions is empty: must be offered in at least one region")
		return
	}
	seen := make(map[string]bool, len(regions))
	for _, r := range regions {
		if _, ok := c.regionIdx[r]; !ok {
			p.add(e, "unknown region %q", r)
		}
		if seen[r] {
			p.add(e, "region %q listed twice", r)
		}
		seen[r] = true
	}
}
