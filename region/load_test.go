package region

import (
	"encoding/json"
	"errors"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/computeql/computeql/quota"
)

// base is a small valid catalogue; each case changes one thing so that it introduces
// exactly one problem (or none).
func base() *Catalog {
	return &Catalog{
		Regions: []Region{{ID: "eu", Name: "EU"}, {ID: "us", Name: "US"}},
		Organizations: []Organization{
			{ID: "acme", Name: "Acme", Projects: []Project{{ID: "web", Name: "Web"}, {ID: "data", Name: "Data"}}},
			{ID: "globex", Name: "Globex", Projects: []Project{{ID: "prod", Name: "Prod"}}},
		},
		Networks: []Network{{ID: "net-a", Name: "A", OrganizationID: "acme", ProjectID: "web", Region: "eu",
			Prefix: netip.MustParsePrefix("10.0.0.0/24")}},
		SecurityGroups: []SecurityGroup{{ID: "sg-a", Name: "ssh", NetworkID: "net-a"}},
		SSHCertificateAuthorities: []SSHCertificateAuthority{{ID: "ca-a", Name: "CA", OrganizationID: "acme", ProjectID: "web",
			PublicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeFakeFake ca"}},
		Flavors: []Flavor{{ID: "f1", Name: "F1", CPUs: 2, MemoryGiB: 4, DiskGB: 20, Architecture: ArchitectureX86_64,
			Regions: []string{"eu"}}},
		Images: []Image{{ID: "i1", Name: "I1", Architecture: ArchitectureX86_64, SizeGiB: 8,
			Virtualization: VirtualizationAny, State: ImageStateReady, Regions: []string{"eu"}}},
	}
}

// refusedExactly checks that the base catalogue, modified, is refused with exactly the error
// want, and no catalogue.
func refusedExactly(t *testing.T, modify func(*Catalog), want string) {
	t.Helper()
	c, err := parseModified(t, modify)
	if err == nil {
		t.Fatalf("accepted; want %q", want)
	}
	if c != nil {
		t.Errorf("returned a catalogue along with the error")
	}
	if err.Error() != want {
		t.Errorf("error:\n%v\nwant exactly\n%s", err, want)
	}
}

func parseModified(t *testing.T, modify func(*Catalog)) (*Catalog, error) {
	t.Helper()
	c := base()
	if modify != nil {
		modify(c)
	}
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return Parse(data)
}

// problemsOf splits a joined error back into its parts.
func problemsOf(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

func TestBaseIsValid(t *testing.T) {
	if _, err := parseModified(t, nil); err != nil {
		t.Fatalf("base catalogue refused:\n%v", err)
	}
}

func TestParseRefuses(t *testing.T) {
	gpu := func(g GPU) func(*Catalog) {
		return func(c *Catalog) { c.Flavors[0].GPU = &g }
	}
	addRegion := func(id, name string) func(*Catalog) {
		return func(c *Catalog) { c.Regions = append(c.Regions, Region{ID: id, Name: name}) }
	}
	for _, tc := range []struct {
		name   string
		modify func(*Catalog)
		want   string // every message must name the entry, so want always includes it
	}{
		// ids and names
		{"upper-case id", addRegion("Mars", "Mars"), `regions[2] "Mars": invalid id`},
		{"brace in id", addRegion("a{b}", "x"), `regions[2] "a{b}": invalid id`},
		{"colon in id", addRegion("a:b", "x"), `regions[2] "a:b": invalid id`},
		{"space in id", addRegion("a b", "x"), `regions[2] "a b": invalid id`},
		{"empty id", addRegion("", "x"), `regions[2] "": invalid id`},
		{"id starting with dash", addRegion("-a", "x"), `regions[2] "-a": invalid id`},
		{"id starting with dot", addRegion(".a", "x"), `regions[2] ".a": invalid id`},
		{"64-character id", addRegion(strings.Repeat("a", 64), "x"), `regions[2] "` + strings.Repeat("a", 64) + `": invalid id`},
		{"empty region name", addRegion("mars", ""), `regions[2] "mars": name is empty`},
		{"duplicate region", addRegion("eu", "EU again"), `regions[2] "eu": duplicate id (also regions[0])`},
		{"invalid organization id", func(c *Catalog) {
			c.Organizations = append(c.Organizations, Organization{ID: "Initech", Name: "Initech"})
		}, `organizations[2] "Initech": invalid id`},
		{"duplicate organization", func(c *Catalog) {
			c.Organizations = append(c.Organizations, Organization{ID: "acme", Name: "Acme 2"})
		}, `organizations[2] "acme": duplicate id`},
		{"empty organization name", func(c *Catalog) { c.Organizations[1].Name = "" }, `organizations[1] "globex": name is empty`},
		{"invalid project id", func(c *Catalog) {
			c.Organizations[0].Projects = append(c.Organizations[0].Projects, Project{ID: "a:b", Name: "x"})
		}, `organizations[0] "acme" projects[2] "a:b": invalid id`},
		{"empty project name", func(c *Catalog) { c.Organizations[0].Projects[1].Name = "" },
			`organizations[0] "acme" projects[1] "data": name is empty`},
		{"duplicate project", func(c *Catalog) {
			c.Organizations[0].Projects = append(c.Organizations[0].Projects, Project{ID: "web", Name: "Web 2"})
		}, `organizations[0] "acme" projects[2] "web": duplicate project id`},
		{"invalid network id", func(c *Catalog) { c.Networks[0].ID, c.SecurityGroups[0].NetworkID = "net{a}", "net{a}" },
			`networks[0] "net{a}": invalid id`},
		{"duplicate network", func(c *Catalog) { c.Networks = append(c.Networks, c.Networks[0]) },
			`networks[1] "net-a": duplicate id (also networks[0])`},
		{"invalid security group id", func(c *Catalog) { c.SecurityGroups[0].ID = "SG" }, `securityGroups[0] "SG": invalid id`},
		{"duplicate security group", func(c *Catalog) { c.SecurityGroups = append(c.SecurityGroups, c.SecurityGroups[0]) },
			`securityGroups[1] "sg-a": duplicate id`},
		{"empty security group name", func(c *Catalog) { c.SecurityGroups[0].Name = "" }, `securityGroups[0] "sg-a": name is empty`},
		{"invalid CA id", func(c *Catalog) { c.SSHCertificateAuthorities[0].ID = "ca a" },
			`sshCertificateAuthorities[0] "ca a": invalid id`},
		{"duplicate CA", func(c *Catalog) {
			c.SSHCertificateAuthorities = append(c.SSHCertificateAuthorities, c.SSHCertificateAuthorities[0])
		}, `sshCertificateAuthorities[1] "ca-a": duplicate id`},
		{"invalid flavor id", func(c *Catalog) { c.Flavors[0].ID = "F1" }, `flavors[0] "F1": invalid id`},
		{"duplicate flavor", func(c *Catalog) { c.Flavors = append(c.Flavors, c.Flavors[0]) }, `flavors[1] "f1": duplicate id`},
		{"empty flavor name", func(c *Catalog) { c.Flavors[0].Name = "" }, `flavors[0] "f1": name is empty`},
		{"invalid image id", func(c *Catalog) { c.Images[0].ID = "i/1" }, `images[0] "i/1": invalid id`},
		{"duplicate image", func(c *Catalog) { c.Images = append(c.Images, c.Images[0]) }, `images[1] "i1": duplicate id`},
		{"empty image name", func(c *Catalog) { c.Images[0].Name = "" }, `images[0] "i1": name is empty`},

		// quota
		{"unknown quota kind", func(c *Catalog) { c.Organizations[0].Quota = quota.Amounts{"server": 5} },
			`organizations[0] "acme": quota: unknown quota kind "server"`},
		{"negative quota limit", func(c *Catalog) { c.Organizations[1].Quota = quota.Amounts{quota.CPUs: -1} },
			`organizations[1] "globex": quota: cpus limit -1 is negative`},

		// networks
		{"network with unknown organization", func(c *Catalog) { c.Networks[0].OrganizationID = "initech" },
			`networks[0] "net-a": unknown organization "initech"`},
		{"network with unknown project", func(c *Catalog) { c.Networks[0].ProjectID = "nope" },
			`networks[0] "net-a": unknown project "nope" of organization "acme"`},
		{"network with another organization's project", func(c *Catalog) { c.Networks[0].ProjectID = "prod" },
			`networks[0] "net-a": unknown project "prod" of organization "acme"`},
		{"network with unknown region", func(c *Catalog) { c.Networks[0].Region = "mars" },
			`networks[0] "net-a": unknown region "mars"`},
		{"network without prefix", func(c *Catalog) { c.Networks[0].Prefix = netip.Prefix{} },
			`networks[0] "net-a": prefix is missing or invalid`},
		{"IPv6 prefix", func(c *Catalog) { c.Networks[0].Prefix = netip.MustParsePrefix("fd00::/64") },
			`networks[0] "net-a": prefix fd00::/64 is not IPv4`},
		{"IPv4-mapped IPv6 prefix", func(c *Catalog) { c.Networks[0].Prefix = netip.MustParsePrefix("::ffff:10.0.0.0/120") },
			`networks[0] "net-a": prefix ::ffff:10.0.0.0/120 is not IPv4`},
		{"prefix too short", func(c *Catalog) { c.Networks[0].Prefix = netip.MustParsePrefix("10.0.0.0/7") },
			`networks[0] "net-a": prefix 10.0.0.0/7: length must be between 8 and 30`},
		{"prefix too long", func(c *Catalog) { c.Networks[0].Prefix = netip.MustParsePrefix("10.0.0.0/31") },
			`networks[0] "net-a": prefix 10.0.0.0/31: length must be between 8 and 30`},
		{"prefix with host bits", func(c *Catalog) { c.Networks[0].Prefix = netip.MustParsePrefix("10.0.0.5/24") },
			`networks[0] "net-a": prefix 10.0.0.5/24 has host bits set (want 10.0.0.0/24)`},

		// security groups
		{"security group on unknown network", func(c *Catalog) { c.SecurityGroups[0].NetworkID = "net-z" },
			`securityGroups[0] "sg-a": unknown network "net-z"`},
		{"rule with no direction", rule(SecurityGroupRule{Protocol: "tcp"}),
			`securityGroups[0] "sg-a" rules[0]: direction "" is not ingress or egress`},
		{"rule with a made-up protocol", rule(SecurityGroupRule{Direction: "ingress", Protocol: "sctp"}),
			`securityGroups[0] "sg-a" rules[0]: protocol "sctp" is not tcp, udp, icmp or any`},
		{"tcp ports reversed", rule(SecurityGroupRule{Direction: "ingress", Protocol: "tcp", PortMin: 90, PortMax: 80}),
			`securityGroups[0] "sg-a" rules[0]: ports 90-80 are not a range within 1-65535`},
		{"udp port above 65535", rule(SecurityGroupRule{Direction: "ingress", Protocol: "udp", PortMin: 1, PortMax: 70000}),
			`securityGroups[0] "sg-a" rules[0]: ports 1-70000 are not a range within 1-65535`},
		{"only a lower port", rule(SecurityGroupRule{Direction: "ingress", Protocol: "tcp", PortMin: 22}),
			`securityGroups[0] "sg-a" rules[0]: ports 22-0 are not a range within 1-65535`},
		{"icmp with ports", rule(SecurityGroupRule{Direction: "egress", Protocol: "icmp", PortMin: 1, PortMax: 1}),
			`securityGroups[0] "sg-a" rules[0]: protocol icmp has no ports`},
		{"remote prefix not a prefix", rule(SecurityGroupRule{Direction: "ingress", Protocol: "any", RemotePrefix: "10.0.0.1"}),
			`securityGroups[0] "sg-a" rules[0]: remotePrefix "10.0.0.1" is not an IPv4 prefix such as 10.0.0.0/8`},
		{"IPv6 remote prefix", rule(SecurityGroupRule{Direction: "ingress", Protocol: "any", RemotePrefix: "::/0"}),
			`securityGroups[0] "sg-a" rules[0]: remotePrefix "::/0" is not an IPv4 prefix such as 10.0.0.0/8`},

		// SSH CAs
		{"CA with unknown organization", func(c *Catalog) { c.SSHCertificateAuthorities[0].OrganizationID = "initech" },
			`sshCertificateAuthorities[0] "ca-a": unknown organization "initech"`},
		{"CA with another organization's project", func(c *Catalog) { c.SSHCertificateAuthorities[0].ProjectID = "prod" },
			`sshCertificateAuthorities[0] "ca-a": unknown project "prod" of organization "acme"`},
		{"CA without public key", func(c *Catalog) { c.SSHCertificateAuthorities[0].PublicKey = "" },
			`sshCertificateAuthorities[0] "ca-a": publicKey is empty`},

		// flavors
		{"flavor without cpus", func(c *Catalog) { c.Flavors[0].CPUs = 0 }, `flavors[0] "f1": cpus must be positive, got 0`},
		{"flavor with negative memory", func(c *Catalog) { c.Flavors[0].MemoryGiB = -4 }, `flavors[0] "f1": memoryGiB must be positive, got -4`},
		{"flavor without disk", func(c *Catalog) { c.Flavors[0].DiskGB = 0 }, `flavors[0] "f1": diskGB must be positive, got 0`},
		{"flavor with unknown architecture", func(c *Catalog) { c.Flavors[0].Architecture = "arm64" },
			`flavors[0] "f1": unknown architecture "arm64"`},
		{"flavor without architecture", func(c *Catalog) { c.Flavors[0].Architecture = "" },
			`flavors[0] "f1": unknown architecture ""`},
		{"GPU without count", gpu(GPU{Vendor: "NVIDIA", Model: "A100", MemoryGiB: 80}),
			`flavors[0] "f1": gpu: physicalCount must be positive, got 0`},
		{"GPU without memory", gpu(GPU{Vendor: "NVIDIA", Model: "A100", PhysicalCount: 1}),
			`flavors[0] "f1": gpu: memoryGiB must be positive, got 0`},
		{"GPU without vendor", gpu(GPU{Model: "A100", MemoryGiB: 80, PhysicalCount: 1}), `flavors[0] "f1": gpu: vendor is empty`},
		{"GPU without model", gpu(GPU{Vendor: "NVIDIA", MemoryGiB: 80, PhysicalCount: 1}), `flavors[0] "f1": gpu: model is empty`},
		{"flavor without regions", func(c *Catalog) { c.Flavors[0].Regions = nil }, `flavors[0] "f1": regions is empty`},
		{"flavor in unknown region", func(c *Catalog) { c.Flavors[0].Regions = []string{"eu", "mars"} },
			`flavors[0] "f1": unknown region "mars"`},
		{"flavor listing a region twice", func(c *Catalog) { c.Flavors[0].Regions = []string{"eu", "eu"} },
			`flavors[0] "f1": region "eu" listed twice`},

		// images
		{"image with unknown architecture", func(c *Catalog) { c.Images[0].Architecture = "amd64" },
			`images[0] "i1": unknown architecture "amd64"`},
		{"image without size", func(c *Catalog) { c.Images[0].SizeGiB = 0 }, `images[0] "i1": sizeGiB must be positive, got 0`},
		{"image with unknown virtualization", func(c *Catalog) { c.Images[0].Virtualization = "container" },
			`images[0] "i1": unknown virtualization "container"`},
		{"image with unknown state", func(c *Catalog) { c.Images[0].State = "deleted" }, `images[0] "i1": unknown state "deleted"`},
		{"image without state", func(c *Catalog) { c.Images[0].State = "" }, `images[0] "i1": unknown state ""`},
		{"image without regions", func(c *Catalog) { c.Images[0].Regions = []string{} }, `images[0] "i1": regions is empty`},
		{"image in unknown region", func(c *Catalog) { c.Images[0].Regions = []string{"mars"} }, `images[0] "i1": unknown region "mars"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseModified(t, tc.modify)
			if err == nil {
				t.Fatalf("accepted; want error containing %q", tc.want)
			}
			if c != nil {
				t.Errorf("returned a catalogue along with the error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error:\n%v\nwant it to contain %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "catalog: ") {
				t.Errorf("error %q does not start with \"catalog: \"", err)
			}
			// One fault, one message: a cascade of follow-on errors hides the real cause.
			if ps := problemsOf(err); len(ps) != 1 {
				t.Errorf("got %d problems, want 1:\n%v", len(ps), err)
			}
		})
	}
}

// rule gives the first security group one rule.
func rule(r SecurityGroupRule) func(*Catalog) {
	return func(c *Catalog) { c.SecurityGroups[0].Rules = []SecurityGroupRule{r} }
}

// A rule's remote prefix is kept in canonical form, and anywhere when none is given.
func TestParseCanonicalisesRemotePrefixes(t *testing.T) {
	c, err := parseModified(t, func(c *Catalog) {
		c.SecurityGroups[0].Rules = []SecurityGroupRule{
			{Direction: "ingress", Protocol: "tcp", PortMin: 80, PortMax: 80, RemotePrefix: "192.0.2.77/24"},
			{Direction: "egress", Protocol: "any"},
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{c.SecurityGroups[0].Rules[0].RemotePrefix, c.SecurityGroups[0].Rules[1].RemotePrefix}; got[0] != "192.0.2.0/24" || got[1] != "0.0.0.0/0" {
		t.Errorf("remote prefixes %v, want [192.0.2.0/24 0.0.0.0/0]", got)
	}
}

func TestParseAccepts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*Catalog)
	}{
		{"id with digits, dots, dashes and underscores", func(c *Catalog) {
			c.Regions = append(c.Regions, Region{ID: "0a.b-c_d", Name: "x"})
		}},
		{"63-character id", func(c *Catalog) { c.Regions = append(c.Regions, Region{ID: strings.Repeat("a", 63), Name: "x"}) }},
		{"single-character id", func(c *Catalog) { c.Regions = append(c.Regions, Region{ID: "z", Name: "z"}) }},
		{"same project id in two organizations", func(c *Catalog) {
			c.Organizations[1].Projects = append(c.Organizations[1].Projects, Project{ID: "web", Name: "Web"})
		}},
		{"organization without projects", func(c *Catalog) {
			c.Organizations = append(c.Organizations, Organization{ID: "initech", Name: "Initech"})
		}},
		{"full quota", func(c *Catalog) { c.Organizations[0].Quota = quota.DefaultLimits() }},
		{"zero quota limits", func(c *Catalog) {
			c.Organizations[0].Quota = quota.Amounts{quota.Servers: 0, quota.GPUs: 0, quota.PublicIPs: 0, quota.CPUs: 0, quota.MemoryGiB: 0}
		}},
		{"network in another project and region", func(c *Catalog) {
			c.Networks = append(c.Networks, Network{ID: "net-b", Name: "B", OrganizationID: "globex", ProjectID: "prod",
				Region: "us", Prefix: netip.MustParsePrefix("10.1.0.0/24")})
		}},
		{"/8 prefix", func(c *Catalog) { c.Networks[0].Prefix = netip.MustParsePrefix("10.0.0.0/8") }},
		{"/30 prefix", func(c *Catalog) { c.Networks[0].Prefix = netip.MustParsePrefix("10.0.0.4/30") }},
		{"rules of every kind", func(c *Catalog) {
			c.SecurityGroups[0].Rules = []SecurityGroupRule{
				{Direction: "ingress", Protocol: "tcp", PortMin: 22, PortMax: 22, RemotePrefix: "192.0.2.0/24"},
				{Direction: "ingress", Protocol: "udp", PortMin: 1, PortMax: 65535},
				{Direction: "ingress", Protocol: "tcp"},
				{Direction: "egress", Protocol: "icmp"},
				{Direction: "egress", Protocol: "any", RemotePrefix: "0.0.0.0/0"},
			}
		}},
		{"second security group on a network", func(c *Catalog) {
			c.SecurityGroups = append(c.SecurityGroups, SecurityGroup{ID: "sg-b", Name: "web", NetworkID: "net-a"})
		}},
		{"CA for another project", func(c *Catalog) {
			c.SSHCertificateAuthorities[0].OrganizationID, c.SSHCertificateAuthorities[0].ProjectID = "globex", "prod"
		}},
		{"aarch64 baremetal flavor with GPU in both regions", func(c *Catalog) {
			f := &c.Flavors[0]
			f.Architecture, f.Baremetal, f.Regions = ArchitectureAArch64, true, []string{"eu", "us"}
			f.GPU = &GPU{Vendor: "NVIDIA", Model: "H100", MemoryGiB: 80, PhysicalCount: 8}
		}},
		{"aarch64 baremetal failed image with OS", func(c *Catalog) {
			im := &c.Images[0]
			im.Architecture, im.Virtualization, im.State = ArchitectureAArch64, VirtualizationBaremetal, ImageStateFailed
			im.OS = &OperatingSystem{Family: "linux", Distro: "debian", Version: "12"}
		}},
		{"virtualized creating image", func(c *Catalog) {
			c.Images[0].Virtualization, c.Images[0].State = VirtualizationVirtualized, ImageStateCreating
		}},
		{"pending image", func(c *Catalog) { c.Images[0].State = ImageStatePending }},
		{"empty catalogue", func(c *Catalog) { *c = Catalog{} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseModified(t, tc.modify); err != nil {
				t.Fatalf("refused:\n%v", err)
			}
		})
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	_, err := parseModified(t, func(c *Catalog) {
		c.Regions = append(c.Regions, Region{ID: "Bad:Id", Name: ""})
		c.Networks[0].Region = "mars"
		c.Networks[0].Prefix = netip.MustParsePrefix("10.0.0.1/24")
		c.SecurityGroups[0].NetworkID = "net-z"
		c.Flavors[0].CPUs = 0
		c.Images[0].State = "gone"
		c.Organizations[0].Quota = quota.Amounts{"bogus": 1}
	})
	if err == nil {
		t.Fatal("accepted a catalogue with many problems")
	}
	want := []string{
		`regions[2] "Bad:Id": invalid id`,
		`regions[2] "Bad:Id": name is empty`,
		`organizations[0] "acme": quota: unknown quota kind "bogus"`,
		`networks[0] "net-a": unknown region "mars"`,
		`networks[0] "net-a": prefix 10.0.0.1/24 has host bits set`,
		`securityGroups[0] "sg-a": unknown network "net-z"`,
		`flavors[0] "f1": cpus must be positive`,
		`images[0] "i1": unknown state "gone"`,
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error is missing %q:\n%v", w, err)
		}
	}
	if ps := problemsOf(err); len(ps) != len(want) {
		t.Errorf("got %d problems, want %d:\n%v", len(ps), len(want), err)
	}
}

func TestParseRefusesMalformedJSON(t *testing.T) {
	for _, tc := range []struct {
		name, data, want string
	}{
		{"unknown top-level field", `{"region": []}`, `unknown field "region"`},
		{"unknown nested field", `{"regions": [{"id": "eu", "name": "EU", "zone": "a"}]}`, `unknown field "zone"`},
		{"unknown GPU field", `{"flavors": [{"id": "f", "gpu": {"cores": 1}}]}`, `unknown field "cores"`},
		{"syntax error", `{"regions": [`, "catalog: decode"},
		{"wrong type", `{"regions": {}}`, "catalog: decode"},
		{"bad prefix", `{"networks": [{"id": "n", "prefix": "10.0.0.0"}]}`, "catalog: decode"},
		{"trailing data", `{} {}`, "unexpected data after the catalogue object"},
		{"trailing garbage", `{}]`, "unexpected data after the catalogue object"},
		{"not an object", `[]`, "catalog: decode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.data))
			if err == nil {
				t.Fatalf("accepted %s", tc.data)
			}
			if c != nil {
				t.Errorf("returned a catalogue along with the error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestParseDefaultsQuota(t *testing.T) {
	c, err := parseModified(t, func(c *Catalog) {
		c.Organizations[0].Quota = quota.Amounts{quota.Servers: 3, quota.PublicIPs: 0}
	})
	if err != nil {
		t.Fatal(err)
	}
	defaults := quota.DefaultLimits()
	for _, tc := range []struct {
		org  string
		want quota.Amounts
	}{
		// An explicit zero must survive: publicIPs 0 is a deliberate limit, not a gap.
		{"acme", quota.Amounts{quota.Servers: 3, quota.GPUs: defaults[quota.GPUs], quota.PublicIPs: 0,
			quota.CPUs: defaults[quota.CPUs], quota.MemoryGiB: defaults[quota.MemoryGiB]}},
		{"globex", defaults},
	} {
		o, _ := c.Organization(tc.org)
		if o.Quota == nil {
			t.Errorf("%s: quota is nil", tc.org)
		}
		if !maps.Equal(o.Quota, tc.want) {
			t.Errorf("%s: quota %v, want %v", tc.org, o.Quota, tc.want)
		}
		for _, k := range quota.Kinds {
			if _, ok := o.Quota[k]; !ok {
				t.Errorf("%s: quota lacks %s", tc.org, k)
			}
		}
	}
	// Organizations must not share one defaults map, or raising one tenant's limit would
	// raise the other's.
	a, _ := c.Organization("acme")
	g, _ := c.Organization("globex")
	g.Quota[quota.Servers]++
	if a.Quota[quota.Servers] != 3 || quota.DefaultLimits()[quota.Servers] != defaults[quota.Servers] {
		t.Error("organizations' quota maps are shared")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()

	good := filepath.Join(dir, "good.json")
	if err := os.WriteFile(good, demoJSON, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(good)
	if err != nil {
		t.Fatalf("Load(%s): %v", good, err)
	}
	if len(c.Flavors) != len(Demo().Flavors) {
		t.Errorf("loaded %d flavors, want %d", len(c.Flavors), len(Demo().Flavors))
	}

	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"regions": [{"id": "Mars", "name": "Mars"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), `regions[0] "Mars"`) {
		t.Errorf("Load(%s) error %v; want it to name the file and the entry", bad, err)
	}

	missing := filepath.Join(dir, "missing.json")
	_, err = Load(missing)
	if err == nil {
		t.Fatalf("Load(%s) succeeded", missing)
	}
	if !strings.Contains(err.Error(), missing) {
		t.Errorf("error %q does not name %s", err, missing)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("error %q does not wrap fs.ErrNotExist", err)
	}
}

func TestLookups(t *testing.T) {
	parsed, err := parseModified(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A Catalog written as a literal has no indexes; lookups must still work on it.
	for name, c := range map[string]*Catalog{"parsed": parsed, "literal": base()} {
		t.Run(name, func(t *testing.T) {
			for _, tc := range []struct {
				kind     string
				lookup   func(string) (any, bool)
				hit      string
				wantAddr any
			}{
				{"region", func(id string) (any, bool) { return c.Region(id) }, "us", &c.Regions[1]},
				{"organization", func(id string) (any, bool) { return c.Organization(id) }, "globex", &c.Organizations[1]},
				{"network", func(id string) (any, bool) { return c.Network(id) }, "net-a", &c.Networks[0]},
				{"securityGroup", func(id string) (any, bool) { return c.SecurityGroup(id) }, "sg-a", &c.SecurityGroups[0]},
				{"sshCA", func(id string) (any, bool) { return c.SSHCertificateAuthority(id) }, "ca-a", &c.SSHCertificateAuthorities[0]},
				{"flavor", func(id string) (any, bool) { return c.Flavor(id) }, "f1", &c.Flavors[0]},
				{"image", func(id string) (any, bool) { return c.Image(id) }, "i1", &c.Images[0]},
			} {
				// Pointer identity, not equality: callers rely on getting the catalogue's own entry.
				if got, ok := tc.lookup(tc.hit); !ok || got != tc.wantAddr {
					t.Errorf("%s %q: got %v, %v; want the catalogue's entry", tc.kind, tc.hit, got, ok)
				}
				for _, miss := range []string{"", "nope", strings.ToUpper(tc.hit)} {
					if got, ok := tc.lookup(miss); ok {
						t.Errorf("%s %q: found %v; want a miss", tc.kind, miss, got)
					}
				}
			}
			for _, tc := range []struct {
				org, project string
				want         bool
			}{
				{"acme", "web", true},
				{"acme", "data", true},
				{"globex", "prod", true},
				{"acme", "prod", false},
				{"globex", "web", false},
				{"initech", "web", false},
				{"", "", false},
			} {
				if got := c.HasProject(tc.org, tc.project); got != tc.want {
					t.Errorf("HasProject(%q, %q) = %v, want %v", tc.org, tc.project, got, tc.want)
				}
			}
		})
	}
}

func TestDemoLookupsMiss(t *testing.T) {
	c := Demo()
	if _, ok := c.Flavor("gpu.h100"); ok {
		t.Error("found a flavor that is not in the demo")
	}
	if !c.HasProject("globex", "staging") || c.HasProject("globex", "data") {
		t.Error("HasProject disagrees with the demo's projects")
	}
}
