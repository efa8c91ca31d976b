package instance_test

import (
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
)

// labCatalog is the demo catalogue with a libvirt region, "lab", holding acme/web's network
// net-acme-web-lab and offering a plain, a GPU and a bare-metal flavor and an image with a
// disk. The GPU flavor is offered in EU West too, a simulated region that runs it.
func labCatalog(t *testing.T) *region.Catalog {
	t.Helper()
	return customCatalog(t, func(c *region.Catalog) {
		c.Regions = append(c.Regions, region.Region{ID: "lab", Name: "Lab", Driver: region.DriverLibvirt,
			Libvirt: &region.LibvirtRegion{URI: "qemu:///system"}})
		c.Networks = append(c.Networks, region.Network{ID: "net-acme-web-lab", Name: "acme web (Lab)",
			OrganizationID: "acme", ProjectID: "web", Region: "lab", Prefix: netip.MustParsePrefix("10.50.0.0/24")})
		c.SecurityGroups = append(c.SecurityGroups, region.SecurityGroup{ID: "sg-acme-web-lab-ssh", Name: "ssh", NetworkID: "net-acme-web-lab"})
		flavor := func(id string, edit func(f *region.Flavor)) region.Flavor {
			f := region.Flavor{ID: id, Name: id, CPUs: 2, MemoryGiB: 4, DiskGB: 20, Architecture: region.ArchitectureX86_64,
				Regions: []string{"lab"}}
			if edit != nil {
				edit(&f)
			}
			return f
		}
		c.Flavors = append(c.Flavors,
			flavor("lv.small", nil),
			flavor("lv.gpu", func(f *region.Flavor) {
				f.GPU = &region.GPU{Vendor: "NVIDIA", Model: "L4", MemoryGiB: 24, PhysicalCount: 1}
				f.Regions = []string{"lab", "eu-west"}
			}),
			flavor("lv.metal", func(f *region.Flavor) { f.Baremetal = true }),
		)
		c.Images = append(c.Images, region.Image{ID: "lab-linux", Name: "Lab Linux", Architecture: region.ArchitectureX86_64,
			SizeGiB: 4, Virtualization: region.VirtualizationAny, State: region.ImageStateReady,
			Regions: []string{"lab", "eu-west"}, File: "/srv/images/lab-linux.qcow2"})
	})
}

// labCreate is a request the lab region accepts.
func labCreate() instance.CreateRequest {
	return instance.CreateRequest{
		OrganizationID: "acme", ProjectID: "web", NetworkID: "net-acme-web-lab",
		Name: "lab-1", FlavorID: "lv.small", ImageID: "lab-linux",
	}
}

func wantUnchanged(t *testing.T, before, after map[string]string) {
	t.Helper()
	if maps.Equal(before, after) {
		return
	}
	for k := range after {
		if before[k] != after[k] {
			t.Errorf("the refusal wrote key %s", k)
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			t.Errorf("the refusal removed key %s", k)
		}
	}
}

// wantMessage fails unless the first problem of err says exactly msg.
func wantMessage(t *testing.T, inv *instance.Invalid, msg string) {
	t.Helper()
	if len(inv.Problems) == 0 || inv.Problems[0].Message != msg {
		t.Errorf("problems %v, want the first to say %q", inv.Problems, msg)
	}
}

func TestCreateInALibvirtRegion(t *testing.T) {
	cat := labCatalog(t)
	for _, tc := range []struct {
		name string
		edit func(r *instance.CreateRequest)
		want []problem
		msg  string // the problem's message
	}{
		{name: "plain flavor"},
		{name: "plain flavor, public IP off", edit: func(r *instance.CreateRequest) {
			r.Networking = &instance.NetworkingRequest{PublicIP: ptr(false), SecurityGroupIDs: []string{"sg-acme-web-lab-ssh"}}
		}},
		{name: "GPU flavor", edit: func(r *instance.CreateRequest) { r.FlavorID = "lv.gpu" },
			want: []problem{p(Unprocessable, "flavorId")},
			msg:  `region "lab" cannot run flavor "lv.gpu": it runs virtual machines on libvirt hosts, without GPUs`},
		{name: "bare-metal flavor", edit: func(r *instance.CreateRequest) { r.FlavorID = "lv.metal" },
			want: []problem{p(Unprocessable, "flavorId")},
			msg:  `region "lab" cannot run flavor "lv.metal": it runs virtual machines on libvirt hosts, not bare metal`},
		{name: "public IP", edit: func(r *instance.CreateRequest) {
			r.Networking = &instance.NetworkingRequest{PublicIP: ptr(true)}
		},
			want: []problem{p(Unprocessable, "networking", "publicIP")},
			msg:  `region "lab" offers no public IP addresses`},
		{name: "GPU flavor and public IP", edit: func(r *instance.CreateRequest) {
			r.FlavorID = "lv.gpu"
			r.Networking = &instance.NetworkingRequest{PublicIP: ptr(true)}
		},
			want: []problem{p(Unprocessable, "flavorId"), p(Unprocessable, "networking", "publicIP")},
			msg:  `region "lab" cannot run flavor "lv.gpu": it runs virtual machines on libvirt hosts, without GPUs`},
		// The refusals are the libvirt region's: a simulated region runs the same GPU flavor
		// with a public IP.
		{name: "GPU flavor and public IP in a simulated region", edit: func(r *instance.CreateRequest) {
			r.NetworkID, r.FlavorID = "net-acme-web-eu", "lv.gpu"
			r.Networking = &instance.NetworkingRequest{PublicIP: ptr(true)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvWith(t, cat)
			req := labCreate()
			if tc.edit != nil {
				tc.edit(&req)
			}
			before := redistest.State(t, e.rdb)
			inst, err := e.svc.Create(acmeMember, req)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("create refused: %v", err)
				}
				if got := e.get(t, acmeMember, inst.ID); got.FlavorID != req.FlavorID || got.NetworkID != req.NetworkID {
					t.Errorf("stored flavor %s network %s, want %s and %s", got.FlavorID, got.NetworkID, req.FlavorID, req.NetworkID)
				}
				return
			}
			inv := wantProblems(t, err, tc.want...)
			wantMessage(t, inv, tc.msg)
			if inst != nil {
				t.Errorf("refused create returned an instance: %+v", inst)
			}
			wantUnchanged(t, before, redistest.State(t, e.rdb))
		})
	}
}

func TestUpdateInALibvirtRegion(t *testing.T) {
	cat := labCatalog(t)
	for _, tc := range []struct {
		name string
		req  instance.UpdateRequest
		want []problem
		msg  string
	}{
		{name: "networking without a public IP",
			req: instance.UpdateRequest{Networking: &instance.NetworkingRequest{AllowedSourceAddresses: []string{"10.0.0.0/8"}}}},
		{name: "public IP left off", req: instance.UpdateRequest{Networking: &instance.NetworkingRequest{PublicIP: ptr(false)}}},
		{name: "public IP turned on", req: instance.UpdateRequest{Networking: &instance.NetworkingRequest{PublicIP: ptr(true)}},
			want: []problem{p(Unprocessable, "networking", "publicIP")},
			msg:  `region "lab" offers no public IP addresses`},
		{name: "rebuilt on the GPU flavor", req: instance.UpdateRequest{FlavorID: ptr("lv.gpu"), AllowRebuild: true},
			want: []problem{p(Unprocessable, "flavorId")},
			msg:  `region "lab" cannot run flavor "lv.gpu": it runs virtual machines on libvirt hosts, without GPUs`},
		{name: "rebuilt on the bare-metal flavor", req: instance.UpdateRequest{FlavorID: ptr("lv.metal"), AllowRebuild: true},
			want: []problem{p(Unprocessable, "flavorId")},
			msg:  `region "lab" cannot run flavor "lv.metal": it runs virtual machines on libvirt hosts, not bare metal`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvWith(t, cat)
			inst := e.create(t, acmeMember, labCreate())
			req := tc.req
			req.ID = inst.ID
			before := redistest.State(t, e.rdb)
			got, err := e.svc.Update(acmeMember, req)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("update refused: %v", err)
				}
				if got.Generation != 2 {
					t.Errorf("generation %d, want 2", got.Generation)
				}
				return
			}
			inv := wantProblems(t, err, tc.want...)
			wantMessage(t, inv, tc.msg)
			wantUnchanged(t, before, redistest.State(t, e.rdb))
			if stored := e.get(t, acmeMember, inst.ID); stored.Generation != 1 || stored.Networking.PublicIP || stored.FlavorID != "lv.small" {
				t.Errorf("refused update was written: generation %d, public IP %t, flavor %s", stored.Generation, stored.Networking.PublicIP, stored.FlavorID)
			}
		})
	}
}

// TestLabCatalogOffersWhatTheTestsNeed guards the fixture: without these the refusals above
// could come from another rule.
func TestLabCatalogOffersWhatTheTestsNeed(t *testing.T) {
	cat := labCatalog(t)
	r, ok := cat.Region("lab")
	if !ok || r.Driver != region.DriverLibvirt || r.OffersPublicIPs() {
		t.Fatalf("region lab: %+v, want a libvirt region", r)
	}
	for _, id := range []string{"lv.small", "lv.gpu", "lv.metal"} {
		f, ok := cat.Flavor(id)
		if !ok || !f.OfferedIn("lab") {
			t.Errorf("flavor %s is not offered in lab", id)
		}
	}
	if f, _ := cat.Flavor("lv.gpu"); !slices.Contains(f.Regions, "eu-west") {
		t.Errorf("lv.gpu is not offered in eu-west")
	}
}
