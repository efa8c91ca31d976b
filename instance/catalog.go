package instance

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/region"
)

// Catalogue reads. Regions, flavors and the catalogue's images are public to every
// authenticated caller; networks, their security groups, SSH certificate authorities and
// snapshot images belong to a project and are shown only to callers who may read it.

// Regions lists the regions.
func (s *Service) Regions(ctx context.Context) ([]region.Region, error) {
	if _, err := Principal(ctx); err != nil {
		return nil, err
	}
	return keep(s.cat.Regions, func(*region.Region) bool { return true }), nil
}

// Flavors lists flavors, of one region when regionID is not "".
func (s *Service) Flavors(ctx context.Context, regionID string) ([]region.Flavor, error) {
	if _, err := Principal(ctx); err != nil {
		return nil, err
	}
	return keep(s.cat.Flavors, func(f *region.Flavor) bool { return regionID == "" || f.OfferedIn(regionID) }), nil
}

// Images lists the public images and the snapshots of every project the caller may read, of
// one region when regionID is not "".
func (s *Service) Images(ctx context.Context, regionID string) ([]region.Image, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, err
	}
	offered := func(i *region.Image) bool { return regionID == "" || i.OfferedIn(regionID) }
	out := keep(s.cat.Images, offered)
	for _, o := range s.cat.Organizations {
		for _, p := range o.Projects {
			if !pr.Allows(o.ID, p.ID, auth.RoleViewer) {
				continue
			}
			snapshots, err := s.region.Images(ctx, o.ID, p.ID)
			if err != nil {
				return nil, regionError(err, "the images")
			}
			slices.SortFunc(snapshots, func(a, b region.Image) int {
				return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.ID, b.ID))
			})
			out = append(out, keep(snapshots, offered)...)
		}
	}
	return out, nil
}

// Networks lists the networks the caller may read, narrowed to an organization and project
// when they are not "".
func (s *Service) Networks(ctx context.Context, org, project string) ([]region.Network, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, err
	}
	return keep(s.cat.Networks, func(n *region.Network) bool {
		return scoped(pr, n.OrganizationID, n.ProjectID, org, project)
	}), nil
}

// SecurityGroups lists the security groups on networks the caller may read, of one network
// when networkID is not "".
func (s *Service) SecurityGroups(ctx context.Context, networkID string) ([]region.SecurityGroup, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, err
	}
	return keep(s.cat.SecurityGroups, func(sg *region.SecurityGroup) bool {
		n, ok := s.cat.Network(sg.NetworkID)
		return ok && (networkID == "" || sg.NetworkID == networkID) && scoped(pr, n.OrganizationID, n.ProjectID, "", "")
	}), nil
}

// SSHCertificateAuthorities lists the SSH CAs the caller may read, narrowed like Networks.
func (s *Service) SSHCertificateAuthorities(ctx context.Context, org, project string) ([]region.SSHCertificateAuthority, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, err
	}
	return keep(s.cat.SSHCertificateAuthorities, func(ca *region.SSHCertificateAuthority) bool {
		return scoped(pr, ca.OrganizationID, ca.ProjectID, org, project)
	}), nil
}

// scoped reports whether a resource of (resOrg, resProject) is readable by pr and inside the
// requested scope ("" matches anything).
func scoped(pr auth.Principal, resOrg, resProject, org, project string) bool {
	return (org == "" || org == resOrg) && (project == "" || project == resProject) &&
		pr.Allows(resOrg, resProject, auth.RoleViewer)
}

// keep returns the items for which ok is true, as a new slice the caller may own.
func keep[T any](items []T, ok func(*T) bool) []T {
	out := []T{}
	for i := range items {
		if ok(&items[i]) {
			out = append(out, items[i])
		}
	}
	return out
}
