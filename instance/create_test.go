package instance_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/region"
)

// createCase is one create request: validCreate changed by edit, made by ctx (acmeMember by
// default), and either accepted (want empty) or refused with exactly the want problems.
type createCase struct {
	name string
	ctx  context.Context
	edit func(r *instance.CreateRequest)
	want []problem
	// check, if set, inspects the accepted instance as Get returns it.
	check func(t *testing.T, got *instance.Instance)
}

// runCreateCases runs each case on a fresh store. A refused request must leave nothing behind:
// no instance, no quota charged.
func runCreateCases(t *testing.T, cat *region.Catalog, cases []createCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvWith(t, cat)
			ctx := tc.ctx
			if ctx == nil {
				ctx = acmeMember
			}
			req := validCreate()
			if tc.edit != nil {
				tc.edit(&req)
			}
			inst, err := e.svc.Create(ctx, req)
			if len(tc.want) > 0 {
				wantProblems(t, err, tc.want...)
				if inst != nil {
					t.Errorf("refused create returned an instance: %+v", inst)
				}
				if n := e.count(t, req.OrganizationID); n != 0 {
					t.Errorf("refused create left %d instances behind", n)
				}
				e.wantUsed(t, req.OrganizationID, nil)
				return
			}
			if err != nil {
				t.Fatalf("create refused: %v", err)
			}
			got := e.get(t, ctx, inst.ID)
			if got.Name != req.Name || got.FlavorID != req.FlavorID || got.ImageID != req.ImageID || got.NetworkID != req.NetworkID {
				t.Errorf("stored %+v, want the request %+v", got.Spec, req)
			}
			if tc.check != nil {
				tc.check(t, got)
			}
		})
	}
}

func TestCreateStoresTheInstance(t *testing.T) {
	e := newEnv(t)
	req := validCreate()
	req.Description = ptr("the first web server")
	req.Tags = []instance.Tag{{Name: "env", Value: "prod"}, {Name: "team", Value: ""}}
	req.SSHCertificateAuthorityID = ptr("ca-acme-web")
	req.Networking = &instance.NetworkingRequest{
		SecurityGroupIDs:       []string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-web"},
		PublicIP:               ptr(true),
		AllowedSourceAddresses: []string{"10.1.2.3/8", " 192.168.1.0/24 ", "2001:db8::1/32"},
	}
	req.UserData = b64("#cloud-config\npackages: [nginx]\n")

	inst := e.create(t, acmeMember, req)
	for _, got := range []*instance.Instance{inst, e.get(t, acmeMember, inst.ID)} {
		if got.OrganizationID != "acme" || got.ProjectID != "web" || got.Generation != 1 || got.StatusVersion != 1 {
			t.Errorf("identity: org %q project %q generation %d status version %d", got.OrganizationID, got.ProjectID, got.Generation, got.StatusVersion)
		}
		s := got.Spec
		if s.Name != "web-1" || s.Description != "the first web server" || s.RegionID != "eu-west" ||
			s.NetworkID != "net-acme-web-eu" || s.FlavorID != "g1.small" || s.ImageID != "ubuntu-24.04" ||
			s.SSHCertificateAuthorityID != "ca-acme-web" || s.RebuildGeneration != 0 || s.DeletedAt != nil {
			t.Errorf("spec: %+v", s)
		}
		if !slices.Equal(s.Tags, req.Tags) {
			t.Errorf("tags %v, want %v", s.Tags, req.Tags)
		}
		wantNet := instance.Networking{
			SecurityGroupIDs:       []string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-web"},
			PublicIP:               true,
			AllowedSourceAddresses: []string{"10.0.0.0/8", "192.168.1.0/24", "2001:db8::/32"},
		}
		if !slices.Equal(s.Networking.SecurityGroupIDs, wantNet.SecurityGroupIDs) || s.Networking.PublicIP != wantNet.PublicIP ||
			!slices.Equal(s.Networking.AllowedSourceAddresses, wantNet.AllowedSourceAddresses) {
			t.Errorf("networking %+v, want %+v", s.Networking, wantNet)
		}
		if string(s.UserData) != "#cloud-config\npackages: [nginx]\n" {
			t.Errorf("user data %q is not the decoded request", s.UserData)
		}
		if !s.CreatedAt.Equal(e.now) || !s.UpdatedAt.Equal(e.now) || s.CreatedBy != "alice" || s.UpdatedBy != "alice" {
			t.Errorf("audit: created %v by %q, updated %v by %q", s.CreatedAt, s.CreatedBy, s.UpdatedAt, s.UpdatedBy)
		}
		want := quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4, quota.PublicIPs: 1}
		if fmt.Sprint(s.Charge) != fmt.Sprint(want) {
			t.Errorf("charge %v, want %v", s.Charge, want)
		}
		st := got.Status
		if st.ProvisioningStatus != instance.ProvisioningPending || st.HealthStatus != instance.HealthUnknown ||
			st.PowerState != instance.PowerPending || st.ObservedGeneration != 0 {
			t.Errorf("status: %+v", st)
		}
		if len(st.Conditions) != 1 || st.Conditions[0].Type != instance.ConditionAvailable ||
			st.Conditions[0].Status != instance.ConditionFalse || st.Conditions[0].Reason != instance.ReasonProvisioning ||
			st.Conditions[0].Message == "" || !st.Conditions[0].LastTransitionTime.Equal(e.now) {
			t.Errorf("conditions: %+v", st.Conditions)
		}
	}
	if n := e.queued(t, inst); n != 1 {
		t.Errorf("instance queued %d times, want once", n)
	}
}

func TestCreateAccess(t *testing.T) {
	cases := []struct {
		name    string
		ctx     context.Context
		project string
		want    instance.Code // "" accepted
	}{
		{"no principal", nobody, "web", instance.CodeUnauthenticated},
		{"project viewer", acmeViewer, "web", instance.CodeForbidden},
		{"project operator", acmeOperator, "web", instance.CodeForbidden},
		{"org-wide viewer", as("v", "acme", "", auth.RoleViewer), "web", instance.CodeForbidden},
		{"org-wide operator", as("o", "acme", "", auth.RoleOperator), "web", instance.CodeForbidden},
		{"member of another project", as("d", "acme", "data", auth.RoleMember), "web", NotFound},
		{"admin of another org", globexAdmin, "web", NotFound},
		{"member of another org's project of the same name", as("g", "globex", "web", auth.RoleMember), "web", NotFound},
		{"no grants at all", asGrants("nobody"), "web", NotFound},
		{"unknown project, org-wide admin", acmeAdmin, "nope", NotFound},
		{"unknown project, member of it", as("m", "acme", "nope", auth.RoleMember), "nope", NotFound},
		{"project member", acmeMember, "web", ""},
		{"org-wide member", as("m", "acme", "", auth.RoleMember), "web", ""},
		{"org-wide admin", acmeAdmin, "web", ""},
		{"viewer of the org and member of the project", asGrants("x",
			auth.Grant{OrganizationID: "acme", Role: auth.RoleViewer},
			auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleMember}), "web", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			req := validCreate()
			req.ProjectID = tc.project
			inst, err := e.svc.Create(tc.ctx, req)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if inst.ProjectID != "web" {
					t.Errorf("project %q", inst.ProjectID)
				}
				return
			}
			wantCode(t, err, tc.want)
			if n := e.count(t, "acme"); n != 0 {
				t.Errorf("refused create left %d instances", n)
			}
		})
	}
}

func TestCreateNetwork(t *testing.T) {
	notFound := []problem{p(NotFound, "networkId")}
	runCreateCases(t, region.Demo(), []createCase{
		{name: "own network in eu", edit: func(r *instance.CreateRequest) { r.NetworkID = "net-acme-web-eu" },
			check: func(t *testing.T, got *instance.Instance) {
				if got.RegionID != "eu-west" {
					t.Errorf("region %q, want the network's eu-west", got.RegionID)
				}
			}},
		{name: "own network in us", edit: func(r *instance.CreateRequest) { r.NetworkID = "net-acme-web-us" },
			check: func(t *testing.T, got *instance.Instance) {
				if got.RegionID != "us-east" {
					t.Errorf("region %q, want the network's us-east", got.RegionID)
				}
			}},
		{name: "network of another project", edit: func(r *instance.CreateRequest) { r.NetworkID = "net-acme-data-eu" }, want: notFound},
		{name: "network of another project, org-wide admin", ctx: acmeAdmin,
			edit: func(r *instance.CreateRequest) { r.NetworkID = "net-acme-data-eu" }, want: notFound},
		{name: "network of another org", edit: func(r *instance.CreateRequest) { r.NetworkID = "net-globex-prod-eu" }, want: notFound},
		{name: "unknown network", edit: func(r *instance.CreateRequest) { r.NetworkID = "net-nope" }, want: notFound},
		{name: "empty network", edit: func(r *instance.CreateRequest) { r.NetworkID = "" }, want: notFound},
	})
}

func TestCreateName(t *testing.T) {
	bad := []problem{p(BadInput, "name")}
	name := func(n string) func(r *instance.CreateRequest) {
		return func(r *instance.CreateRequest) { r.Name = n }
	}
	runCreateCases(t, region.Demo(), []createCase{
		{name: "one character", edit: name("a")},
		{name: "one digit", edit: name("7")},
		{name: "63 characters", edit: name(strings.Repeat("a", 63))},
		{name: "upper case", edit: name("Web-1")},
		{name: "dots, dashes and underscores inside", edit: name("a.b_c-d")},
		{name: "consecutive punctuation inside", edit: name("a--..__b")},
		{name: "empty", edit: name(""), want: bad},
		{name: "64 characters", edit: name(strings.Repeat("a", 64)), want: bad},
		{name: "leading dash", edit: name("-web"), want: bad},
		{name: "trailing dash", edit: name("web-"), want: bad},
		{name: "leading dot", edit: name(".web"), want: bad},
		{name: "trailing underscore", edit: name("web_"), want: bad},
		{name: "only a dash", edit: name("-"), want: bad},
		{name: "space inside", edit: name("web 1"), want: bad},
		{name: "trailing space", edit: name("web1 "), want: bad},
		{name: "unicode letter", edit: name("wéb"), want: bad},
		{name: "slash", edit: name("web/1"), want: bad},
		{name: "newline inside", edit: name("web\n1"), want: bad},
		{name: "trailing newline", edit: name("web-1\n"), want: bad},
	})
}

func TestCreateFlavorAndImage(t *testing.T) {
	set := func(network, flavor, image string) func(r *instance.CreateRequest) {
		return func(r *instance.CreateRequest) {
			if network != "" {
				r.NetworkID = network
			}
			r.FlavorID, r.ImageID = flavor, image
		}
	}
	imageBad := []problem{p(Unprocessable, "imageId")}
	runCreateCases(t, region.Demo(), []createCase{
		{name: "gpu flavor in its region", edit: set("", "gpu.a100x2", "ubuntu-24.04")},
		{name: "unknown flavor", edit: set("", "g9.huge", "ubuntu-24.04"), want: []problem{p(NotFound, "flavorId")}},
		{name: "empty flavor", edit: set("", "", "ubuntu-24.04"), want: []problem{p(NotFound, "flavorId")}},
		{name: "flavor not offered in the network's region", edit: set("net-acme-web-us", "gpu.a100x2", "ubuntu-24.04"),
			want: []problem{p(Unprocessable, "flavorId")}},
		{name: "unknown image", edit: set("", "g1.small", "ubuntu-99.04"), want: []problem{p(NotFound, "imageId")}},
		{name: "image not ready", edit: set("", "g1.small", "fedora-41"), want: imageBad},
		{name: "unknown flavor and unknown image", edit: set("", "nope", "nope"),
			want: []problem{p(NotFound, "flavorId"), p(NotFound, "imageId")}},

		// Architecture.
		{name: "arm flavor, x86 image", edit: set("", "a1.medium", "ubuntu-24.04"), want: imageBad},
		{name: "x86 flavor, arm image", edit: set("", "g1.small", "ubuntu-24.04-arm"), want: imageBad},
		{name: "arm flavor, arm image", edit: set("", "a1.medium", "ubuntu-24.04-arm")},

		// Disk: windows-2022 needs 40 GiB.
		{name: "image larger than the flavor disk", edit: set("", "g1.small", "windows-2022"), want: imageBad},
		{name: "image fits the flavor disk", edit: set("", "g1.medium", "windows-2022")},

		// Virtualization.
		{name: "baremetal image on a virtualized flavor", edit: set("", "g1.medium", "debian-12-metal"), want: imageBad},
		{name: "baremetal image on a small virtualized flavor: disk and virtualization",
			edit: set("", "g1.small", "debian-12-metal"), want: []problem{p(Unprocessable, "imageId"), p(Unprocessable, "imageId")}},
		{name: "baremetal image on a baremetal flavor", edit: set("", "bm.metal", "debian-12-metal")},
		{name: "virtualized image on a baremetal flavor", edit: set("", "bm.metal", "rocky-9"), want: imageBad},
		{name: "virtualized image on a virtualized flavor", edit: set("", "g1.small", "rocky-9")},
		{name: "any image on a baremetal flavor", edit: set("", "bm.metal", "ubuntu-24.04")},
		{name: "any image on a virtualized flavor", edit: set("", "g1.small", "ubuntu-24.04")},
		{name: "arm image on a baremetal x86 flavor", edit: set("", "bm.metal", "ubuntu-24.04-arm"), want: imageBad},
	})
}

// diskCatalog adds a 20 GB flavor and images of 18 and 19 GiB, and an image offered in
// eu-west only.
func diskCatalog(t *testing.T) *region.Catalog {
	return customCatalog(t, func(c *region.Catalog) {
		c.Flavors = append(c.Flavors, region.Flavor{
			ID: "d20", Name: "20 GB disk", CPUs: 1, MemoryGiB: 1, DiskGB: 20,
			Architecture: region.ArchitectureX86_64, Regions: []string{"eu-west", "us-east"},
		})
		for _, img := range []struct {
			id      string
			size    int64
			regions []string
		}{
			{"img-18", 18, []string{"eu-west", "us-east"}},
			{"img-19", 19, []string{"eu-west", "us-east"}},
			{"img-eu", 8, []string{"eu-west"}},
		} {
			c.Images = append(c.Images, region.Image{
				ID: img.id, Name: img.id, Architecture: region.ArchitectureX86_64, SizeGiB: img.size,
				Virtualization: region.VirtualizationAny, State: region.ImageStateReady, Regions: img.regions,
			})
		}
	})
}

func TestCreateDiskGBVersusGiB(t *testing.T) {
	set := func(network, flavor, image string) func(r *instance.CreateRequest) {
		return func(r *instance.CreateRequest) { r.NetworkID, r.FlavorID, r.ImageID = network, flavor, image }
	}
	runCreateCases(t, diskCatalog(t), []createCase{
		// 19 <= 20, but 19 GiB = 20.4e9 bytes does not fit on 20e9 bytes.
		{name: "19 GiB image on 20 GB disk", edit: set("net-acme-web-eu", "d20", "img-19"), want: []problem{p(Unprocessable, "imageId")}},
		// 18 GiB = 19.3e9 bytes fits.
		{name: "18 GiB image on 20 GB disk", edit: set("net-acme-web-eu", "d20", "img-18")},
		{name: "image offered in the region", edit: set("net-acme-web-eu", "g1.small", "img-eu")},
		{name: "image not offered in the network's region", edit: set("net-acme-web-us", "g1.small", "img-eu"),
			want: []problem{p(Unprocessable, "imageId")}},
	})
}

func TestCreateSecurityGroups(t *testing.T) {
	sgs := func(ids ...string) func(r *instance.CreateRequest) {
		return func(r *instance.CreateRequest) { r.Networking = &instance.NetworkingRequest{SecurityGroupIDs: ids} }
	}
	at := func(code instance.Code, i string) problem { return p(code, "networking", "securityGroupIds", i) }
	many := make([]string, instance.MaxSecurityGroup+1)
	for i := range many {
		many[i] = "sg-acme-web-eu-ssh"
	}
	runCreateCases(t, region.Demo(), []createCase{
		{name: "none", edit: sgs()},
		{name: "both of the network's", edit: sgs("sg-acme-web-eu-ssh", "sg-acme-web-eu-web"),
			check: func(t *testing.T, got *instance.Instance) {
				if !slices.Equal(got.Networking.SecurityGroupIDs, []string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-web"}) {
					t.Errorf("security groups %v", got.Networking.SecurityGroupIDs)
				}
			}},
		{name: "unknown", edit: sgs("sg-nope"), want: []problem{at(NotFound, "0")}},
		{name: "unknown second", edit: sgs("sg-acme-web-eu-ssh", "sg-nope"), want: []problem{at(NotFound, "1")}},
		{name: "on another network of the project", edit: sgs("sg-acme-web-us-ssh"), want: []problem{at(NotFound, "0")}},
		{name: "on another project's network", edit: sgs("sg-acme-data-eu-ssh"), want: []problem{at(NotFound, "0")}},
		{name: "of another org", edit: sgs("sg-globex-prod-eu-web"), want: []problem{at(NotFound, "0")}},
		{name: "duplicate", edit: sgs("sg-acme-web-eu-ssh", "sg-acme-web-eu-ssh"), want: []problem{at(BadInput, "1")}},
		{name: "duplicate after another", edit: sgs("sg-acme-web-eu-ssh", "sg-acme-web-eu-web", "sg-acme-web-eu-ssh"),
			want: []problem{at(BadInput, "2")}},
		{name: "several wrong", edit: sgs("sg-nope", "sg-acme-web-eu-web", "sg-nope", "sg-globex-prod-eu-ssh"),
			want: []problem{at(NotFound, "0"), at(BadInput, "2"), at(NotFound, "3")}},
		{name: "too many", edit: sgs(many...), want: []problem{p(BadInput, "networking", "securityGroupIds")}},
	})
}

func TestCreateAllowedSourceAddresses(t *testing.T) {
	cidrs := func(c ...string) func(r *instance.CreateRequest) {
		return func(r *instance.CreateRequest) { r.Networking = &instance.NetworkingRequest{AllowedSourceAddresses: c} }
	}
	stored := func(want ...string) func(t *testing.T, got *instance.Instance) {
		return func(t *testing.T, got *instance.Instance) {
			if !slices.Equal(got.Networking.AllowedSourceAddresses, want) {
				t.Errorf("stored %q, want %q", got.Networking.AllowedSourceAddresses, want)
			}
		}
	}
	at := func(i string) problem { return p(BadInput, "networking", "allowedSourceAddresses", i) }
	many := make([]string, instance.MaxSourceCIDRs+1)
	for i := range many {
		many[i] = "10.0.0.0/8"
	}
	runCreateCases(t, region.Demo(), []createCase{
		{name: "ipv4", edit: cidrs("203.0.113.0/24"), check: stored("203.0.113.0/24")},
		{name: "ipv4 host bits are masked", edit: cidrs("10.1.2.3/8"), check: stored("10.0.0.0/8")},
		{name: "ipv4 single host", edit: cidrs("198.51.100.7/32"), check: stored("198.51.100.7/32")},
		{name: "everything", edit: cidrs("0.0.0.0/0", "::/0"), check: stored("0.0.0.0/0", "::/0")},
		{name: "ipv6 host bits are masked", edit: cidrs("2001:db8::1/32"), check: stored("2001:db8::/32")},
		{name: "surrounding space is trimmed", edit: cidrs(" 10.0.0.0/8\t"), check: stored("10.0.0.0/8")},
		{name: "exactly the maximum", edit: cidrs(many[:instance.MaxSourceCIDRs]...)},
		{name: "address without length", edit: cidrs("10.0.0.1"), want: []problem{at("0")}},
		{name: "ipv4 length over 32", edit: cidrs("10.0.0.0/33"), want: []problem{at("0")}},
		{name: "ipv6 length over 128", edit: cidrs("2001:db8::/129"), want: []problem{at("0")}},
		{name: "not an address", edit: cidrs("localhost/8"), want: []problem{at("0")}},
		{name: "empty", edit: cidrs(""), want: []problem{at("0")}},
		{name: "bad second and fourth", edit: cidrs("10.0.0.0/8", "10.0.0.256/8", "::/0", "10/8"), want: []problem{at("1"), at("3")}},
		{name: "too many", edit: cidrs(many...), want: []problem{p(BadInput, "networking", "allowedSourceAddresses")}},
	})
}

func TestCreateSSHCertificateAuthority(t *testing.T) {
	ca := func(id string) func(r *instance.CreateRequest) {
		return func(r *instance.CreateRequest) { r.SSHCertificateAuthorityID = ptr(id) }
	}
	notFound := []problem{p(NotFound, "sshCertificateAuthorityId")}
	runCreateCases(t, region.Demo(), []createCase{
		{name: "same project", edit: ca("ca-acme-web"), check: func(t *testing.T, got *instance.Instance) {
			if got.SSHCertificateAuthorityID != "ca-acme-web" {
				t.Errorf("ca %q", got.SSHCertificateAuthorityID)
			}
		}},
		{name: "none given", edit: func(r *instance.CreateRequest) { r.SSHCertificateAuthorityID = nil }},
		{name: "empty means none", edit: ca(""), check: func(t *testing.T, got *instance.Instance) {
			if got.SSHCertificateAuthorityID != "" {
				t.Errorf("ca %q", got.SSHCertificateAuthorityID)
			}
		}},
		{name: "another project", edit: ca("ca-acme-data"), want: notFound},
		{name: "another project, org-wide admin", ctx: acmeAdmin, edit: ca("ca-acme-data"), want: notFound},
		{name: "another org", edit: ca("ca-globex-prod"), want: notFound},
		{name: "unknown", edit: ca("ca-nope"), want: notFound},
	})
}

func TestCreateUserData(t *testing.T) {
	ud := func(encoded *string, ca string) func(r *instance.CreateRequest) {
		return func(r *instance.CreateRequest) {
			r.UserData = encoded
			if ca != "" {
				r.SSHCertificateAuthorityID = ptr(ca)
			}
		}
	}
	stored := func(want []byte) func(t *testing.T, got *instance.Instance) {
		return func(t *testing.T, got *instance.Instance) {
			if !bytes.Equal(got.UserData, want) {
				t.Errorf("stored user data %q, want %q", got.UserData, want)
			}
		}
	}
	accepted := func(name, data string) createCase {
		return createCase{name: name, edit: ud(b64(data), ""), check: stored([]byte(data))}
	}
	bad := []problem{p(BadInput, "userData")}
	gz := gzipped(t, "#cloud-config\npackages: [nginx]\n")
	gzEncoded := ptr(base64.StdEncoding.EncodeToString(gz))
	full := "#cloud-config\n" + strings.Repeat("#", instance.MaxUserDataBytes-len("#cloud-config\n"))
	runCreateCases(t, region.Demo(), []createCase{
		accepted("cloud-config", "#cloud-config\npackages: [nginx]\n"),
		accepted("cloud-config with CRLF", "#cloud-config\r\npackages: [nginx]\r\n"),
		accepted("cloud-config without a newline", "#cloud-config"),
		accepted("script", "#!/bin/sh\necho hello\n"),
		accepted("boothook", "#cloud-boothook\n#!/bin/sh\necho early\n"),
		accepted("cloud-config archive", "#cloud-config-archive\n- type: text/cloud-config\n  content: '#cloud-config'\n"),
		accepted("include", "#include\nhttps://example.com/user-data\n"),
		accepted("part handler", "#part-handler\ndef list_types(): return []\n"),
		accepted("jinja template", "## template: jinja\n#cloud-config\nhostname: {{ v1.local_hostname }}\n"),
		accepted("MIME multipart", "Content-Type: multipart/mixed; boundary=\"==XYZ==\"\nMIME-Version: 1.0\n\n--==XYZ==\n--==XYZ==--\n"),
		accepted("MIME multipart, lower case header", "content-type: multipart/mixed; boundary=x\n\n--x--\n"),
		accepted("exactly the size cap", full),
		{name: "exactly the size cap, base64 wrapped at 76 columns", edit: ud(ptr(wrap76(base64.StdEncoding.EncodeToString([]byte(full)))), ""), check: stored([]byte(full))},
		{name: "empty user data is none", edit: ud(ptr(""), ""), check: stored(nil)},
		{name: "gzip without a CA", edit: ud(gzEncoded, ""), check: stored(gz)},
		{name: "script with a CA", edit: ud(b64("#!/bin/sh\n"), "ca-acme-web")},

		{name: "plain text", edit: ud(b64("hello world\n"), ""), want: bad},
		{name: "leading space before the marker", edit: ud(b64(" #cloud-config\n"), ""), want: bad},
		{name: "marker on the second line", edit: ud(b64("\n#cloud-config\n"), ""), want: bad},
		{name: "a comment that is no marker", edit: ud(b64("# cloud-config\n"), ""), want: bad},
		{name: "json", edit: ud(b64(`{"packages": ["nginx"]}`), ""), want: bad},
		{name: "invalid base64", edit: ud(ptr("not base64!"), ""), want: bad},
		{name: "base64 of the wrong alphabet", edit: ud(ptr("I2Nsb3VkLWNvbmZpZwo_-"), ""), want: bad},
		{name: "one byte over the size cap", edit: ud(b64(full+"#"), ""), want: bad},
		{name: "far over the size cap", edit: ud(b64(full+full), ""), want: bad},
		{name: "gzip with a CA", edit: ud(gzEncoded, "ca-acme-web"), want: []problem{p(Unprocessable, "userData")}},
	})
}

func TestCreateTagsAndDescription(t *testing.T) {
	tags := func(tt ...instance.Tag) func(r *instance.CreateRequest) {
		return func(r *instance.CreateRequest) { r.Tags = tt }
	}
	tag := func(name, value string) instance.Tag { return instance.Tag{Name: name, Value: value} }
	n := func(count int) []instance.Tag {
		out := make([]instance.Tag, count)
		for i := range out {
			out[i] = tag(fmt.Sprintf("t%d", i), "v")
		}
		return out
	}
	desc := func(d string) func(r *instance.CreateRequest) {
		return func(r *instance.CreateRequest) { r.Description = ptr(d) }
	}
	at := func(i, part string) problem { return p(BadInput, "tags", i, part) }
	long := strings.Repeat("é", instance.MaxTagName) // runes, not bytes
	runCreateCases(t, region.Demo(), []createCase{
		{name: "two tags", edit: tags(tag("env", "prod"), tag("team", "web")), check: func(t *testing.T, got *instance.Instance) {
			if !slices.Equal(got.Tags, []instance.Tag{tag("env", "prod"), tag("team", "web")}) {
				t.Errorf("tags %v", got.Tags)
			}
		}},
		{name: "empty value", edit: tags(tag("env", ""))},
		{name: "longest name and value", edit: tags(tag(long, strings.Repeat("v", instance.MaxTagValue)))},
		{name: "reserved prefix in the middle is fine", edit: tags(tag("my-compute/x", "v"))},
		{name: "most tags", edit: tags(n(instance.MaxTags)...)},
		{name: "reserved prefix", edit: tags(tag("compute/instance-id", "x")), want: []problem{at("0", "name")}},
		{name: "reserved prefix alone", edit: tags(tag("ok", "1"), tag("compute/", "x")), want: []problem{at("1", "name")}},
		{name: "duplicate name", edit: tags(tag("env", "a"), tag("env", "b")), want: []problem{at("1", "name")}},
		{name: "empty name", edit: tags(tag("", "x")), want: []problem{at("0", "name")}},
		{name: "name too long", edit: tags(tag(long+"é", "x")), want: []problem{at("0", "name")}},
		{name: "value too long", edit: tags(tag("env", strings.Repeat("v", instance.MaxTagValue+1))), want: []problem{at("0", "value")}},
		{name: "several wrong", edit: tags(tag("ok", "1"), tag("compute/x", "1"), tag("ok", strings.Repeat("v", instance.MaxTagValue+1))),
			want: []problem{at("1", "name"), at("2", "name"), at("2", "value")}},
		{name: "too many", edit: tags(n(instance.MaxTags + 1)...), want: []problem{p(BadInput, "tags")}},

		{name: "longest description", edit: desc(strings.Repeat("é", instance.MaxDescription)), check: func(t *testing.T, got *instance.Instance) {
			if got.Description != strings.Repeat("é", instance.MaxDescription) {
				t.Errorf("description not stored")
			}
		}},
		{name: "description too long", edit: desc(strings.Repeat("d", instance.MaxDescription+1)), want: []problem{p(BadInput, "description")}},
	})
}

// TestCreateReportsEveryFailureAtOnce breaks several rules in one request, including quota.
func TestCreateReportsEveryFailureAtOnce(t *testing.T) {
	e := newEnv(t)
	req := globexCreate()
	req.Name = "-bad-"
	req.FlavorID = "gpu.a100x2" // globex has gpus 0
	req.ImageID = "nope"
	req.Networking = &instance.NetworkingRequest{
		SecurityGroupIDs:       []string{"sg-globex-prod-eu-ssh", "sg-acme-web-eu-ssh"},
		AllowedSourceAddresses: []string{"10.0.0.0/8", "nope"},
	}
	req.UserData = b64("just text")
	_, err := e.svc.Create(globexMember, req)
	inv := wantProblems(t, err,
		p(BadInput, "name"),
		p(NotFound, "imageId"),
		p(NotFound, "networking", "securityGroupIds", "1"),
		p(BadInput, "networking", "allowedSourceAddresses", "1"),
		p(BadInput, "userData"),
		p(QuotaExceeded, "flavorId"),
	)
	if msg := inv.Problems[5].Message; msg != "quota exceeded for gpus: 2 requested in total, limit 0" {
		t.Errorf("quota message %q", msg)
	}
	if n := e.count(t, "globex"); n != 0 {
		t.Errorf("%d instances stored", n)
	}
	e.wantUsed(t, "globex", nil)

	// Every rule before quota at once, and quota is not prechecked without a usable flavor.
	req = validCreate()
	req.NetworkID = "net-globex-prod-eu"
	req.Name = ""
	req.Description = ptr(strings.Repeat("d", instance.MaxDescription+1))
	req.Tags = []instance.Tag{{Name: "compute/x"}}
	req.FlavorID = "nope"
	req.ImageID = "fedora-41"
	req.SSHCertificateAuthorityID = ptr("ca-globex-prod")
	req.UserData = ptr("!!")
	_, err = e.svc.Create(acmeMember, req)
	wantProblems(t, err,
		p(NotFound, "networkId"),
		p(BadInput, "name"),
		p(BadInput, "description"),
		p(BadInput, "tags", "0", "name"),
		p(NotFound, "flavorId"),
		p(Unprocessable, "imageId"),
		p(NotFound, "sshCertificateAuthorityId"),
		p(BadInput, "userData"),
	)
}

func TestCreateNameClaims(t *testing.T) {
	e := newEnv(t)
	first := e.create(t, acmeMember, validCreate())

	// The same name on the same network is taken.
	_, err := e.svc.Create(acmeMember, validCreate())
	wantProblems(t, err, p(Conflict, "name"))

	// Another name on the same network, and the same name on other networks, are fine.
	other := validCreate()
	other.Name = "web-2"
	second := e.create(t, acmeMember, other)
	us := validCreate()
	us.NetworkID = "net-acme-web-us"
	third := e.create(t, acmeMember, us)
	data := validCreate()
	data.ProjectID, data.NetworkID = "data", "net-acme-data-eu"
	fourth := e.create(t, as("d", "acme", "data", auth.RoleMember), data)
	fifth := e.create(t, globexMember, instance.CreateRequest{
		OrganizationID: "globex", ProjectID: "prod", NetworkID: "net-globex-prod-eu",
		Name: "web-1", FlavorID: "g1.small", ImageID: "ubuntu-24.04",
	})

	// A request refused for other problems reports the taken name as well, so every problem
	// comes at once.
	dup := validCreate()
	dup.Tags = []instance.Tag{{Name: "a"}, {Name: "a"}}
	_, err = e.svc.Create(acmeMember, dup)
	wantProblems(t, err, p(BadInput, "tags", "1", "name"), p(Conflict, "name"))

	// Names are hostnames, which ignore case: a name differing only in case is taken too,
	// whether the store's atomic write or the precheck finds it.
	upper := validCreate()
	upper.Name = "WEB-1"
	_, err = e.svc.Create(acmeMember, upper)
	wantProblems(t, err, p(Conflict, "name"))
	upper.Tags = dup.Tags
	_, err = e.svc.Create(acmeMember, upper)
	wantProblems(t, err, p(BadInput, "tags", "1", "name"), p(Conflict, "name"))

	// A deleted instance keeps its name until workers forget it.
	if _, err := e.svc.Delete(acmeMember, first.ID, nil); err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Create(acmeMember, validCreate())
	wantProblems(t, err, p(Conflict, "name"))

	// Every instance has its own fresh UUID, never the name claim.
	seen := map[string]bool{}
	for _, inst := range []*instance.Instance{first, second, third, fourth, fifth} {
		id, err := uuid.Parse(inst.ID)
		if err != nil || id.String() != inst.ID {
			t.Errorf("id %q is not a canonical UUID: %v", inst.ID, err)
		}
		if inst.ID == instance.NameClaim(inst.NetworkID, inst.Name) {
			t.Errorf("id %s is the name claim", inst.ID)
		}
		if seen[inst.ID] {
			t.Errorf("id %s given twice", inst.ID)
		}
		seen[inst.ID] = true
	}
	if n := e.count(t, "acme"); n != 4 {
		t.Errorf("acme has %d instances, want 4", n)
	}
}

func TestNameClaimIsDeterministic(t *testing.T) {
	a := instance.NameClaim("net-a", "web-1")
	if a != instance.NameClaim("net-a", "web-1") {
		t.Fatal("the claim of one name on one network changes")
	}
	if _, err := uuid.Parse(a); err != nil {
		t.Fatalf("claim %q is not a UUID", a)
	}
	if instance.NameClaim("net-a", "Web-1") != a {
		t.Error("names differing only in case have different claims; hostnames ignore case")
	}
	for _, other := range [][2]string{{"net-b", "web-1"}, {"net-a", "web-2"}, {"net-aw", "eb-1"}} {
		if instance.NameClaim(other[0], other[1]) == a {
			t.Errorf("claim of %v equals that of net-a/web-1", other)
		}
	}
}

// wrap76 breaks base64 into MIME-style lines, as many tools emit it.
func wrap76(s string) string {
	var b strings.Builder
	for len(s) > 76 {
		b.WriteString(s[:76] + "\r\n")
		s = s[76:]
	}
	b.WriteString(s)
	return b.String()
}

// TestDiskMessageSpeaksInUsersUnits: the refusal of an image too large for the flavor's disk
// gives both sizes in the units they are sold in, not in bytes.
func TestDiskMessageSpeaksInUsersUnits(t *testing.T) {
	e := newEnvWith(t, diskCatalog(t))
	req := validCreate()
	req.NetworkID, req.FlavorID, req.ImageID = "net-acme-web-eu", "d20", "img-19"
	_, err := e.svc.Create(acmeMember, req)
	const want = `image "img-19" needs 19 GiB of disk (20.4 GB) but flavor "d20" has 20 GB`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("refusal %v, want it to say %s", err, want)
	}
}

// TestNameConflictQuotesTheExistingName: a name taken in another case is refused, quoting the
// existing instance's name as it was given, not the request's.
func TestNameConflictQuotesTheExistingName(t *testing.T) {
	e := newEnv(t)
	req := validCreate()
	req.Name = "Web-1"
	e.create(t, acmeMember, req)
	req.Name = "web-1"
	_, err := e.svc.Create(acmeMember, req)
	wantProblems(t, err, p(Conflict, "name"))
	if err == nil || !strings.Contains(err.Error(), `an instance named "Web-1" already exists`) {
		t.Errorf("refusal %v, want it to quote the existing name Web-1", err)
	}
}
