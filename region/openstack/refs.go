package openstack

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/pagination"

	"github.com/computeql/computeql/region"
)

// The kinds of cloud object a catalogue entry names.
const (
	kindFlavor        = "flavor"
	kindImage         = "image"
	kindNetwork       = "network"
	kindSecurityGroup = "security group"
)

// refKey is a catalogue entry: its kind and catalogue id.
type refKey struct{ kind, id string }

// cloudID is the cloud's id of a catalogue entry: the id its reference gives, the object its
// reference names (looked up once, then kept), or, without a reference, its catalogue id.
func (d *Driver) cloudID(ctx context.Context, kind, catalogID string, ref *region.OpenStackRef) (string, error) {
	switch {
	case ref == nil:
		return catalogID, nil
	case ref.ID != "":
		return ref.ID, nil
	}
	key := refKey{kind, catalogID}
	d.refsMu.Lock()
	id, ok := d.refs[key]
	d.refsMu.Unlock()
	if ok {
		return id, nil
	}
	id, err := d.lookUp(ctx, kind, ref.Name)
	if err != nil {
		return "", fmt.Errorf("catalogue %s %q: %w", kind, catalogID, err)
	}
	d.rememberRef(key, id)
	return id, nil
}

// rememberRef keeps the cloud's id of a catalogue entry named by name.
func (d *Driver) rememberRef(key refKey, id string) {
	d.refsMu.Lock()
	defer d.refsMu.Unlock()
	if d.refs == nil {
		d.refs = map[refKey]string{}
	}
	d.refs[key] = id
}

// flavorsByName lists the cloud's flavors, by name: Nova's API filters flavors by no name,
// so one listing serves every flavor looked up at once.
func (d *Driver) flavorsByName(ctx context.Context) (map[string][]string, error) {
	var byName map[string][]string
	err := d.call(ctx, "list flavors", func(ctx context.Context, c *clients) error {
		var err error
		byName, err = idsByName(ctx, flavors.ListDetail(c.compute, flavors.ListOpts{AccessType: flavors.AllAccess}), flavors.ExtractFlavors,
			func(f *flavors.Flavor) (string, string) { return f.ID, f.Name })
		return err
	})
	return byName, err
}

// idsByName lists the objects of a listing, every page, as ids by name.
func idsByName[T any](ctx context.Context, pager pagination.Pager, extract func(pagination.Page) ([]T, error), idName func(*T) (id, name string)) (map[string][]string, error) {
	pages, err := pager.AllPages(ctx)
	if err != nil {
		return nil, err
	}
	list, err := extract(pages)
	byName := map[string][]string{}
	for i := range list {
		id, name := idName(&list[i])
		byName[name] = append(byName[name], id)
	}
	return byName, err
}

// theOne is the id of the one object of the kind with the name, of those found by it; none,
// or more than one, is refused.
func theOne(kind, name string, ids []string) (string, error) {
	switch {
	case len(ids) == 0:
		return "", fmt.Errorf("the cloud has no %s named %q: %w", kind, name, region.ErrRefused)
	case len(ids) > 1:
		return "", fmt.Errorf("the cloud has %d %ss named %q (%s): name it by its id: %w", len(ids), kind, name, strings.Join(ids, ", "), region.ErrRefused)
	}
	return ids[0], nil
}

// lookUp finds the one object of the kind with the name; none, or more than one, is refused.
func (d *Driver) lookUp(ctx context.Context, kind, name string) (string, error) {
	var byName map[string][]string
	var err error
	if kind == kindFlavor {
		byName, err = d.flavorsByName(ctx)
	} else {
		err = d.call(ctx, "look up "+kind+" "+name, func(ctx context.Context, c *clients) error {
			var err error
			switch kind {
			case kindImage:
				byName, err = idsByName(ctx, images.List(c.image, images.ListOpts{Name: name}), images.ExtractImages,
					func(im *images.Image) (string, string) { return im.ID, im.Name })
			case kindNetwork:
				byName, err = idsByName(ctx, networks.List(c.network, networks.ListOpts{Name: name}), networks.ExtractNetworks,
					func(n *networks.Network) (string, string) { return n.ID, n.Name })
			default:
				byName, err = idsByName(ctx, groups.List(c.network, groups.ListOpts{Name: name}), groups.ExtractGroups,
					func(g *groups.SecGroup) (string, string) { return g.ID, g.Name })
			}
			return err
		})
	}
	if err != nil {
		return "", err
	}
	return theOne(kind, name, byName[name])
}

// exists checks that the cloud has the object of the kind with the id (flavors are checked
// in their listing, see checkEntry).
func (d *Driver) exists(ctx context.Context, kind, id string) error {
	err := d.call(ctx, "read "+kind+" "+id, func(ctx context.Context, c *clients) error {
		switch kind {
		case kindImage:
			return images.Get(ctx, c.image, id).Err
		case kindNetwork:
			return networks.Get(ctx, c.network, id).Err
		}
		return groups.Get(ctx, c.network, id).Err
	})
	if errors.Is(err, errNotFound) {
		return fmt.Errorf("the cloud has no %s %s: %w", kind, id, region.ErrRefused)
	}
	return err
}

// entry is a catalogue entry Check looks up.
type entry struct {
	kind, id string
	ref      *region.OpenStackRef
}

// cloudID is the id the entry gives the cloud's object: its reference's, or its own.
func (e entry) cloudID() string {
	if e.ref != nil {
		return e.ref.ID
	}
	return e.id
}

// Check looks up, in the cloud, every flavor, image, network and security group the region's
// catalogue entries name, and returns what it does not have, or has more than one of by the
// name given: a process checks its catalogue when it starts. A cloud that does not answer is
// an error wrapping region.ErrUnreachable or region.ErrUnavailable, after which names are
// looked up on first use instead.
func (d *Driver) Check(ctx context.Context) error {
	cat, rid := d.opts.Catalog, d.opts.Region.ID
	var entries []entry
	for _, f := range cat.Flavors {
		if f.OfferedIn(rid) {
			entries = append(entries, entry{kindFlavor, f.ID, f.OpenStack})
		}
	}
	for _, im := range cat.Images {
		if im.OfferedIn(rid) {
			entries = append(entries, entry{kindImage, im.ID, im.OpenStack})
		}
	}
	for _, n := range cat.Networks {
		if n.Region == rid {
			entries = append(entries, entry{kindNetwork, n.ID, n.OpenStack})
		}
	}
	for _, sg := range cat.SecurityGroups {
		if n, ok := cat.Network(sg.NetworkID); ok && n.Region == rid {
			entries = append(entries, entry{kindSecurityGroup, sg.ID, sg.OpenStack})
		}
	}
	// The flavors, of one listing, rather than one listing per flavor named by name.
	var flavorIDs map[string][]string
	if slices.ContainsFunc(entries, func(e entry) bool { return e.kind == kindFlavor }) {
		var err error
		if flavorIDs, err = d.flavorsByName(ctx); err != nil {
			return fmt.Errorf("openstack: region %s: check the catalogue against the cloud: %w", rid, err)
		}
	}
	var problems []error
	for _, e := range entries {
		err := d.checkEntry(ctx, e, flavorIDs)
		switch {
		case errors.Is(err, region.ErrUnreachable) || errors.Is(err, region.ErrUnavailable):
			return fmt.Errorf("openstack: region %s: check the catalogue against the cloud: %w", rid, err)
		case err != nil:
			problems = append(problems, err)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("openstack: region %s: the catalogue names what the cloud does not have: %w", rid, errors.Join(problems...))
	}
	return nil
}

// checkEntry looks an entry up in the cloud; flavors in the cloud's flavors by name.
func (d *Driver) checkEntry(ctx context.Context, e entry, flavorIDs map[string][]string) error {
	named := e.ref != nil && e.ref.Name != ""
	var err error
	switch {
	case e.kind == kindFlavor && named:
		var id string
		if id, err = theOne(e.kind, e.ref.Name, flavorIDs[e.ref.Name]); err == nil {
			d.rememberRef(refKey{e.kind, e.id}, id)
		}
	case e.kind == kindFlavor:
		err = fmt.Errorf("the cloud has no %s %s: %w", e.kind, e.cloudID(), region.ErrRefused)
		for _, ids := range flavorIDs {
			if slices.Contains(ids, e.cloudID()) {
				err = nil
			}
		}
	case named:
		_, err = d.cloudID(ctx, e.kind, e.id, e.ref)
		return err // says which entry
	default:
		err = d.exists(ctx, e.kind, e.cloudID())
	}
	if err != nil {
		return fmt.Errorf("catalogue %s %q: %w", e.kind, e.id, err)
	}
	return nil
}
