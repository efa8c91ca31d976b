package openstack

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/external"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"

	"github.com/computeql/computeql/region"
)

// externalNetwork is the cloud's id of the region's external network, looked up once: by id
// when the catalogue names a UUID (as Neutron writes its ids), else by name, among the
// networks marked router:external.
func (d *Driver) externalNetwork(ctx context.Context) (string, error) {
	d.extMu.Lock()
	defer d.extMu.Unlock()
	if d.extID != "" {
		return d.extID, nil
	}
	ref := d.opts.Region.OpenStack.ExternalNetwork
	opts := networks.ListOpts{Name: ref}
	if len(ref) == 36 && uuid.Validate(ref) == nil {
		opts = networks.ListOpts{ID: ref}
	}
	isExternal := true
	var found []networks.Network
	err := d.call(ctx, "find external network "+ref, func(ctx context.Context, c *clients) error {
		pages, err := networks.List(c.network, external.ListOptsExt{ListOptsBuilder: opts, External: &isExternal}).AllPages(ctx)
		if err != nil {
			return err
		}
		found, err = networks.ExtractNetworks(pages)
		return err
	})
	if err != nil {
		return "", err
	}
	if len(found) != 1 {
		return "", fmt.Errorf("openstack: the cloud has %d external networks %q, the region's externalNetwork, where it needs one: %w",
			len(found), ref, region.ErrRefused)
	}
	d.extID = found[0].ID
	return d.extID, nil
}

// floatingIPs are the floating IPs on a port.
func (d *Driver) floatingIPs(ctx context.Context, portID string) ([]floatingips.FloatingIP, error) {
	var list []floatingips.FloatingIP
	err := d.call(ctx, "list the floating IPs of port "+portID, func(ctx context.Context, c *clients) error {
		pages, err := floatingips.List(c.network, floatingips.ListOpts{PortID: portID}).AllPages(ctx)
		if err != nil {
			return err
		}
		list, err = floatingips.ExtractFloatingIPs(pages)
		return err
	})
	return list, err
}

// addFloatingIP gives a port a floating IP of the external network, described as the
// server's other objects are so that one left over says whose it was.
func (d *Driver) addFloatingIP(ctx context.Context, portID, desc string) error {
	ext, err := d.externalNetwork(ctx)
	if err != nil {
		return err
	}
	err = d.call(ctx, "give port "+portID+" a floating IP", func(ctx context.Context, c *clients) error {
		_, err := floatingips.Create(ctx, c.network, floatingips.CreateOpts{FloatingNetworkID: ext, PortID: portID, Description: desc}).Extract()
		return err
	})
	if errors.Is(err, errNotFound) {
		// The external network may have been replaced under the same name: look it up again
		// next time.
		d.extMu.Lock()
		d.extID = ""
		d.extMu.Unlock()
		return fmt.Errorf("%w: %w", err, region.ErrRefused)
	}
	return err
}

// releaseFloatingIPs deletes the floating IPs on a port. Neutron only disassociates them when
// the port goes, so they are released before it, or the project keeps paying for them.
func (d *Driver) releaseFloatingIPs(ctx context.Context, portID string) error {
	list, err := d.floatingIPs(ctx, portID)
	if err != nil {
		return err
	}
	for _, fip := range list {
		err := d.call(ctx, "release floating IP "+fip.FloatingIP, func(ctx context.Context, c *clients) error {
			return floatingips.Delete(ctx, c.network, fip.ID).ExtractErr()
		})
		if err != nil && !errors.Is(err, errNotFound) {
			return err
		}
	}
	return nil
}

// setFloatingIP gives a port a floating IP, or releases the ones it has, as the networking
// asks.
func (d *Driver) setFloatingIP(ctx context.Context, portID, desc string, public bool) error {
	if !public {
		return d.releaseFloatingIPs(ctx, portID)
	}
	have, err := d.floatingIPs(ctx, portID)
	if err != nil || len(have) > 0 {
		return err
	}
	return d.addFloatingIP(ctx, portID, desc)
}

// publicIP is the address of the port's floating IP, read from Neutron since Nova's cached
// addresses of the server learn of it only later, if at all; "" when it has none, or when the
// region hands out none.
func (d *Driver) publicIP(ctx context.Context, portID string) (string, error) {
	if !d.opts.Region.OffersPublicIPs() {
		return "", nil
	}
	list, err := d.floatingIPs(ctx, portID)
	if err != nil || len(list) == 0 {
		return "", err
	}
	return list[0].FloatingIP, nil
}
