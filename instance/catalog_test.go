package instance_test

import (
	"context"
	"slices"
	"testing"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/region"
)

func ids[T any](items []T, idOf func(*T) string) []string {
	out := []string{}
	for i := range items {
		out = append(out, idOf(&items[i]))
	}
	return out
}

func networkIDs(n []region.Network) []string {
	return ids(n, func(n *region.Network) string { return n.ID })
}

func TestCatalogueNetworksGroupsAndCAs(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name           string
		ctx            context.Context
		org, project   string
		networks       []string
		securityGroups []string // of every network, networkID ""
		cas            []string
	}{
		{name: "acme/web member", ctx: acmeMember,
			networks:       []string{"net-acme-web-eu", "net-acme-web-us"},
			securityGroups: []string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-web", "sg-acme-web-us-ssh", "sg-acme-web-us-web"},
			cas:            []string{"ca-acme-web"}},
		{name: "acme/web viewer", ctx: acmeViewer,
			networks:       []string{"net-acme-web-eu", "net-acme-web-us"},
			securityGroups: []string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-web", "sg-acme-web-us-ssh", "sg-acme-web-us-web"},
			cas:            []string{"ca-acme-web"}},
		{name: "acme org-wide viewer", ctx: as("v", "acme", "", auth.RoleViewer),
			networks: []string{"net-acme-web-eu", "net-acme-web-us", "net-acme-data-eu", "net-acme-data-us"},
			securityGroups: []string{
				"sg-acme-web-eu-ssh", "sg-acme-web-eu-web", "sg-acme-web-us-ssh", "sg-acme-web-us-web",
				"sg-acme-data-eu-ssh", "sg-acme-data-eu-web", "sg-acme-data-us-ssh", "sg-acme-data-us-web",
			},
			cas: []string{"ca-acme-web", "ca-acme-data"}},
		{name: "acme org-wide viewer, narrowed to data", ctx: as("v", "acme", "", auth.RoleViewer), org: "acme", project: "data",
			networks: []string{"net-acme-data-eu", "net-acme-data-us"},
			securityGroups: []string{
				"sg-acme-web-eu-ssh", "sg-acme-web-eu-web", "sg-acme-web-us-ssh", "sg-acme-web-us-web",
				"sg-acme-data-eu-ssh", "sg-acme-data-eu-web", "sg-acme-data-us-ssh", "sg-acme-data-us-web",
			},
			cas: []string{"ca-acme-data"}},
		{name: "acme/web member narrowed to another org", ctx: acmeMember, org: "globex",
			networks:       []string{},
			securityGroups: []string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-web", "sg-acme-web-us-ssh", "sg-acme-web-us-web"},
			cas:            []string{}},
		{name: "acme/web member narrowed to a project it cannot read", ctx: acmeMember, org: "acme", project: "data",
			networks:       []string{},
			securityGroups: []string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-web", "sg-acme-web-us-ssh", "sg-acme-web-us-web"},
			cas:            []string{}},
		{name: "globex/prod member", ctx: globexMember,
			networks:       []string{"net-globex-prod-eu", "net-globex-prod-us"},
			securityGroups: []string{"sg-globex-prod-eu-ssh", "sg-globex-prod-eu-web", "sg-globex-prod-us-ssh", "sg-globex-prod-us-web"},
			cas:            []string{"ca-globex-prod"}},
		{name: "no grants", ctx: asGrants("x"), networks: []string{}, securityGroups: []string{}, cas: []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nets, err := e.svc.Networks(tc.ctx, tc.org, tc.project)
			if err != nil {
				t.Fatal(err)
			}
			if got := networkIDs(nets); !slices.Equal(got, tc.networks) {
				t.Errorf("networks %v, want %v", got, tc.networks)
			}
			sgs, err := e.svc.SecurityGroups(tc.ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(sgs, func(s *region.SecurityGroup) string { return s.ID }); !slices.Equal(got, tc.securityGroups) {
				t.Errorf("security groups %v, want %v", got, tc.securityGroups)
			}
			cas, err := e.svc.SSHCertificateAuthorities(tc.ctx, tc.org, tc.project)
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(cas, func(c *region.SSHCertificateAuthority) string { return c.ID }); !slices.Equal(got, tc.cas) {
				t.Errorf("SSH CAs %v, want %v", got, tc.cas)
			}
		})
	}

	t.Run("security groups of one network", func(t *testing.T) {
		for _, tc := range []struct {
			network string
			want    []string
		}{
			{"net-acme-web-eu", []string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-web"}},
			{"net-acme-data-eu", []string{}},   // not readable by acme/web
			{"net-globex-prod-eu", []string{}}, // another org
			{"net-nope", []string{}},
		} {
			sgs, err := e.svc.SecurityGroups(acmeMember, tc.network)
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(sgs, func(s *region.SecurityGroup) string { return s.ID }); !slices.Equal(got, tc.want) {
				t.Errorf("%s: %v, want %v", tc.network, got, tc.want)
			}
		}
	})
}

func TestCataloguePublicReads(t *testing.T) {
	e := newEnv(t)
	flavorIDs := func(f []region.Flavor) []string { return ids(f, func(f *region.Flavor) string { return f.ID }) }
	imageIDs := func(i []region.Image) []string { return ids(i, func(i *region.Image) string { return i.ID }) }
	allImages := []string{"ubuntu-24.04", "ubuntu-24.04-arm", "debian-12-metal", "rocky-9", "fedora-41", "windows-2022"}
	// Any authenticated caller reads them, even without grants.
	for _, ctx := range []context.Context{acmeMember, globexMember, asGrants("x")} {
		for _, tc := range []struct {
			region  string
			flavors []string
			images  []string
		}{
			{"", []string{"g1.small", "g1.medium", "g1.large", "gpu.a100x2", "bm.metal", "a1.medium"}, allImages},
			{"eu-west", []string{"g1.small", "g1.medium", "g1.large", "gpu.a100x2", "bm.metal", "a1.medium"}, allImages},
			{"us-east", []string{"g1.small", "g1.medium", "g1.large", "bm.metal", "a1.medium"}, allImages},
			{"mars", []string{}, []string{}},
		} {
			f, err := e.svc.Flavors(ctx, tc.region)
			if err != nil {
				t.Fatal(err)
			}
			if got := flavorIDs(f); !slices.Equal(got, tc.flavors) {
				t.Errorf("flavors of %q: %v, want %v", tc.region, got, tc.flavors)
			}
			i, err := e.svc.Images(ctx, tc.region)
			if err != nil {
				t.Fatal(err)
			}
			if got := imageIDs(i); !slices.Equal(got, tc.images) {
				t.Errorf("images of %q: %v, want %v", tc.region, got, tc.images)
			}
		}
		r, err := e.svc.Regions(ctx)
		if err != nil || !slices.Equal(ids(r, func(r *region.Region) string { return r.ID }), []string{"eu-west", "us-east"}) {
			t.Errorf("regions %v, %v", r, err)
		}
	}

	// An image offered in one region only is filtered.
	cat := customCatalog(t, func(c *region.Catalog) {
		c.Images = append(c.Images, region.Image{ID: "eu-only", Name: "EU only", Architecture: region.ArchitectureX86_64,
			SizeGiB: 1, Virtualization: region.VirtualizationAny, State: region.ImageStateReady, Regions: []string{"eu-west"}})
	})
	e2 := newEnvWith(t, cat)
	us, _ := e2.svc.Images(acmeMember, "us-east")
	eu, _ := e2.svc.Images(acmeMember, "eu-west")
	if slices.Contains(imageIDs(us), "eu-only") || !slices.Contains(imageIDs(eu), "eu-only") {
		t.Errorf("eu-only listed in us-east %v / eu-west %v", imageIDs(us), imageIDs(eu))
	}

	// The caller owns what it is given: changing it does not change the catalogue.
	f, _ := e.svc.Flavors(acmeMember, "")
	f[0].ID = "changed"
	if again, _ := e.svc.Flavors(acmeMember, ""); again[0].ID != "g1.small" {
		t.Errorf("a caller changed the catalogue: %q", again[0].ID)
	}
}

func TestCatalogueNeedsAPrincipal(t *testing.T) {
	e := newEnv(t)
	errs := []error{}
	_, err := e.svc.Regions(nobody)
	errs = append(errs, err)
	_, err = e.svc.Flavors(nobody, "")
	errs = append(errs, err)
	_, err = e.svc.Images(nobody, "")
	errs = append(errs, err)
	_, err = e.svc.Networks(nobody, "", "")
	errs = append(errs, err)
	_, err = e.svc.SecurityGroups(nobody, "")
	errs = append(errs, err)
	_, err = e.svc.SSHCertificateAuthorities(nobody, "", "")
	errs = append(errs, err)
	for i, err := range errs {
		if instance.CodeOf(err) != instance.CodeUnauthenticated {
			t.Errorf("read %d: %v, want UNAUTHENTICATED", i, err)
		}
	}
}
