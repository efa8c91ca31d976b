package region

import (
	"maps"
	"net/netip"
	"testing"

	"github.com/computeql/computeql/quota"
)

// The embedded file is only parsed lazily by Demo, so this is what keeps a broken
// demo.json from turning into a panic at run time.
func TestDemoJSONIsValid(t *testing.T) {
	if _, err := Parse(demoJSON); err != nil {
		t.Fatalf("embedded demo.json does not parse:\n%v", err)
	}
}

func TestDemoIsParsedOnce(t *testing.T) {
	if Demo() != Demo() {
		t.Fatal("Demo returned different catalogues; want one shared value")
	}
}

func TestDemoCounts(t *testing.T) {
	c := Demo()
	for _, tc := range []struct {
		name string
		got  int
		want int
	}{
		{"regions", len(c.Regions), 2},
		{"organizations", len(c.Organizations), 2},
		{"networks", len(c.Networks), 8},
		{"securityGroups", len(c.SecurityGroups), 16},
		{"sshCertificateAuthorities", len(c.SSHCertificateAuthorities), 4},
		{"flavors", len(c.Flavors), 6},
		{"images", len(c.Images), 6},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, tc.got, tc.want)
		}
	}
}

func TestDemoRegionsAndOrganizations(t *testing.T) {
	c := Demo()
	for id, name := range map[string]string{"eu-west": "EU West", "us-east": "US East"} {
		r, ok := c.Region(id)
		if !ok || r.Name != name {
			t.Errorf("Region(%q) = %+v, %v; want name %q", id, r, ok, name)
		}
	}
	for _, tc := range []struct {
		id, name string
		projects map[string]string
		quota    quota.Amounts
	}{
		{"acme", "Acme Corp", map[string]string{"web": "Web", "data": "Data"},
			quota.Amounts{quota.Servers: 50, quota.GPUs: 4, quota.PublicIPs: 10, quota.CPUs: 256, quota.MemoryGiB: 1024}},
		{"globex", "Globex", map[string]string{"prod": "Production", "staging": "Staging"},
			quota.Amounts{quota.Servers: 20, quota.GPUs: 0, quota.PublicIPs: 4, quota.CPUs: 64, quota.MemoryGiB: 256}},
	} {
		o, ok := c.Organization(tc.id)
		if !ok {
			t.Errorf("Organization(%q) not found", tc.id)
			continue
		}
		if o.Name != tc.name {
			t.Errorf("%s: name %q, want %q", tc.id, o.Name, tc.name)
		}
		got := map[string]string{}
		for _, p := range o.Projects {
			got[p.ID] = p.Name
		}
		if !maps.Equal(got, tc.projects) {
			t.Errorf("%s: projects %v, want %v", tc.id, got, tc.projects)
		}
		if !maps.Equal(o.Quota, tc.quota) {
			t.Errorf("%s: quota %v, want %v", tc.id, o.Quota, tc.quota)
		}
	}
}

func TestDemoNetworksAndSecurityGroups(t *testing.T) {
	c := Demo()
	for _, tc := range []struct {
		org, project, region, suffix, label, prefix string
	}{
		{"acme", "web", "eu-west", "eu", "EU West", "10.10.0.0/24"},
		{"acme", "web", "us-east", "us", "US East", "10.11.0.0/24"},
		{"acme", "data", "eu-west", "eu", "EU West", "10.20.0.0/24"},
		{"acme", "data", "us-east", "us", "US East", "10.21.0.0/24"},
		{"globex", "prod", "eu-west", "eu", "EU West", "10.30.0.0/24"},
		{"globex", "prod", "us-east", "us", "US East", "10.31.0.0/24"},
		{"globex", "staging", "eu-west", "eu", "EU West", "10.40.0.0/24"},
		{"globex", "staging", "us-east", "us", "US East", "10.41.0.0/24"},
	} {
		stem := tc.org + "-" + tc.project + "-" + tc.suffix
		id := "net-" + stem
		n, ok := c.Network(id)
		if !ok {
			t.Errorf("Network(%q) not found", id)
			continue
		}
		want := Network{
			ID: id, Name: tc.org + " " + tc.project + " (" + tc.label + ")",
			OrganizationID: tc.org, ProjectID: tc.project, Region: tc.region,
			Prefix: netip.MustParsePrefix(tc.prefix),
		}
		if *n != want {
			t.Errorf("Network(%q) = %+v, want %+v", id, *n, want)
		}
		for _, name := range []string{"ssh", "web"} {
			sgID := "sg-" + stem + "-" + name
			sg, ok := c.SecurityGroup(sgID)
			if !ok {
				t.Errorf("SecurityGroup(%q) not found", sgID)
				continue
			}
			if sg.Name != name || sg.NetworkID != id {
				t.Errorf("SecurityGroup(%q) = %+v, want name %q on %q", sgID, *sg, name, id)
			}
		}
	}
	// Distinct prefixes are not enough for tests that route between networks: none may overlap.
	for i, a := range c.Networks {
		for _, b := range c.Networks[i+1:] {
			if a.Prefix.Overlaps(b.Prefix) {
				t.Errorf("networks %q (%s) and %q (%s) overlap", a.ID, a.Prefix, b.ID, b.Prefix)
			}
		}
	}
}

func TestDemoSSHCertificateAuthorities(t *testing.T) {
	c := Demo()
	for _, tc := range []struct{ org, project string }{
		{"acme", "web"}, {"acme", "data"}, {"globex", "prod"}, {"globex", "staging"},
	} {
		id := "ca-" + tc.org + "-" + tc.project
		ca, ok := c.SSHCertificateAuthority(id)
		if !ok {
			t.Errorf("SSHCertificateAuthority(%q) not found", id)
			continue
		}
		if ca.OrganizationID != tc.org || ca.ProjectID != tc.project {
			t.Errorf("%s: owner %s/%s, want %s/%s", id, ca.OrganizationID, ca.ProjectID, tc.org, tc.project)
		}
		if want := tc.org + " " + tc.project + " users CA"; ca.Name != want {
			t.Errorf("%s: name %q, want %q", id, ca.Name, want)
		}
		if len(ca.PublicKey) < len("ssh-ed25519 AAAA") || ca.PublicKey[:len("ssh-ed25519 AAAA")] != "ssh-ed25519 AAAA" {
			t.Errorf("%s: publicKey %q does not look like an ed25519 key", id, ca.PublicKey)
		}
	}
}

func TestDemoFlavors(t *testing.T) {
	c := Demo()
	both := []string{"eu-west", "us-east"}
	for _, tc := range []struct {
		id                    string
		cpus, memGiB, diskGB  int64
		arch                  Architecture
		baremetal, gpu        bool
		regions, notInRegions []string
	}{
		{"g1.small", 2, 4, 20, ArchitectureX86_64, false, false, both, nil},
		{"g1.medium", 4, 16, 80, ArchitectureX86_64, false, false, both, nil},
		{"g1.large", 8, 32, 160, ArchitectureX86_64, false, false, both, nil},
		{"gpu.a100x2", 16, 128, 500, ArchitectureX86_64, false, true, []string{"eu-west"}, []string{"us-east"}},
		{"bm.metal", 64, 256, 960, ArchitectureX86_64, true, false, both, nil},
		{"a1.medium", 4, 8, 80, ArchitectureAArch64, false, false, both, nil},
	} {
		f, ok := c.Flavor(tc.id)
		if !ok {
			t.Errorf("Flavor(%q) not found", tc.id)
			continue
		}
		if f.CPUs != tc.cpus || f.MemoryGiB != tc.memGiB || f.DiskGB != tc.diskGB {
			t.Errorf("%s: %d cpus %d GiB %d GB, want %d %d %d", tc.id, f.CPUs, f.MemoryGiB, f.DiskGB, tc.cpus, tc.memGiB, tc.diskGB)
		}
		if f.Architecture != tc.arch || f.Baremetal != tc.baremetal || (f.GPU != nil) != tc.gpu {
			t.Errorf("%s: arch %s baremetal %v gpu %v, want %s %v %v", tc.id, f.Architecture, f.Baremetal, f.GPU != nil, tc.arch, tc.baremetal, tc.gpu)
		}
		for _, r := range tc.regions {
			if !f.OfferedIn(r) {
				t.Errorf("%s: not offered in %s", tc.id, r)
			}
		}
		for _, r := range tc.notInRegions {
			if f.OfferedIn(r) {
				t.Errorf("%s: offered in %s, want not", tc.id, r)
			}
		}
	}
	f, _ := c.Flavor("gpu.a100x2")
	if want := (GPU{Vendor: "NVIDIA", Model: "A100", MemoryGiB: 80, PhysicalCount: 2}); f.GPU == nil || *f.GPU != want {
		t.Errorf("gpu.a100x2: gpu %+v, want %+v", f.GPU, want)
	}
}

func TestDemoImages(t *testing.T) {
	c := Demo()
	for _, tc := range []struct {
		id      string
		arch    Architecture
		sizeGiB int64
		virt    Virtualization
		state   ImageState
	}{
		{"ubuntu-24.04", ArchitectureX86_64, 8, VirtualizationAny, ImageStateReady},
		{"ubuntu-24.04-arm", ArchitectureAArch64, 8, VirtualizationAny, ImageStateReady},
		{"debian-12-metal", ArchitectureX86_64, 20, VirtualizationBaremetal, ImageStateReady},
		{"rocky-9", ArchitectureX86_64, 10, VirtualizationVirtualized, ImageStateReady},
		{"fedora-41", ArchitectureX86_64, 8, VirtualizationAny, ImageStatePending},
		{"windows-2022", ArchitectureX86_64, 40, VirtualizationVirtualized, ImageStateReady},
	} {
		im, ok := c.Image(tc.id)
		if !ok {
			t.Errorf("Image(%q) not found", tc.id)
			continue
		}
		if im.Architecture != tc.arch || im.SizeGiB != tc.sizeGiB || im.Virtualization != tc.virt || im.State != tc.state {
			t.Errorf("%s: %s %d GiB %s %s, want %s %d %s %s", tc.id, im.Architecture, im.SizeGiB, im.Virtualization, im.State,
				tc.arch, tc.sizeGiB, tc.virt, tc.state)
		}
		if !im.OfferedIn("eu-west") || !im.OfferedIn("us-east") {
			t.Errorf("%s: regions %v, want both", tc.id, im.Regions)
		}
	}
	for id, want := range map[string]OperatingSystem{
		"ubuntu-24.04": {Family: "linux", Distro: "ubuntu", Version: "24.04"},
		"windows-2022": {Family: "windows", Distro: "windows", Version: "2022"},
	} {
		if im, _ := c.Image(id); im.OS == nil || *im.OS != want {
			t.Errorf("%s: os %+v, want %+v", id, im.OS, want)
		}
	}
}

// Instance rule tests lean on these facts of the demo; spelling them out here means a
// change to demo.json that breaks them fails in this package, next to the cause.
func TestDemoPropertiesOtherTestsRelyOn(t *testing.T) {
	c := Demo()
	small, _ := c.Flavor("g1.small")
	windows, _ := c.Image("windows-2022")
	if imageBytes, diskBytes := windows.SizeGiB<<30, small.DiskGB*1_000_000_000; imageBytes <= diskBytes {
		t.Errorf("windows-2022 (%d bytes) fits g1.small's disk (%d bytes); want too large", imageBytes, diskBytes)
	}
	for _, f := range c.Flavors {
		if f.GPU != nil && f.ID != "gpu.a100x2" {
			t.Errorf("flavor %q has a GPU; want gpu.a100x2 the only one", f.ID)
		}
	}
	for _, im := range c.Images {
		if notReady := im.State != ImageStateReady; notReady != (im.ID == "fedora-41") {
			t.Errorf("image %q state %s; want fedora-41 the only image not ready", im.ID, im.State)
		}
	}
	var armFlavors, armImages int
	for _, f := range c.Flavors {
		if f.Architecture == ArchitectureAArch64 {
			armFlavors++
		}
	}
	for _, im := range c.Images {
		if im.Architecture == ArchitectureAArch64 {
			armImages++
		}
	}
	if armFlavors != 1 || armImages != 1 {
		t.Errorf("aarch64 flavors %d, images %d; want 1 each (a1.medium, ubuntu-24.04-arm)", armFlavors, armImages)
	}
	if o, _ := c.Organization("globex"); o.Quota[quota.GPUs] != 0 {
		t.Errorf("globex gpus quota %d, want 0", o.Quota[quota.GPUs])
	}
}

func TestOfferedIn(t *testing.T) {
	f := &Flavor{Regions: []string{"a", "b"}}
	im := &Image{Regions: []string{"b"}}
	for _, tc := range []struct {
		region       string
		flavor, imag bool
	}{
		{"a", true, false},
		{"b", true, true},
		{"c", false, false},
		{"", false, false},
	} {
		if got := f.OfferedIn(tc.region); got != tc.flavor {
			t.Errorf("flavor OfferedIn(%q) = %v, want %v", tc.region, got, tc.flavor)
		}
		if got := im.OfferedIn(tc.region); got != tc.imag {
			t.Errorf("image OfferedIn(%q) = %v, want %v", tc.region, got, tc.imag)
		}
	}
}
