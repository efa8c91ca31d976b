package openstack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/rules"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/pagination"

	"github.com/computeql/computeql/region"
)

// createOpts adds the description, which gophercloud's options lack, to a server's create.
type createOpts struct {
	servers.CreateOptsBuilder
	description string
}

func (o createOpts) ToServerCreateMap() (map[string]any, error) {
	m, err := o.CreateOptsBuilder.ToServerCreateMap()
	if err != nil {
		return nil, err
	}
	m["server"].(map[string]any)["description"] = o.description
	return m, nil
}

// resolved is a spec's catalogue entries as the cloud's ids.
type resolved struct {
	flavor, image, network string
	groups                 []string
}

// resolve looks the spec's flavor, image, network and security groups up in the catalogue,
// and an image it does not have among the project's snapshots; what is not there, or not in
// this region or the spec's project, or a snapshot not yet READY, is refused.
func (d *Driver) resolve(ctx context.Context, spec region.ServerSpec) (resolved, error) {
	var r resolved
	cat, rid := d.opts.Catalog, d.opts.Region.ID
	f, ok := cat.Flavor(spec.FlavorID)
	if !ok || !f.OfferedIn(rid) {
		return r, fmt.Errorf("flavor %q is not offered in region %s: %w", spec.FlavorID, rid, region.ErrRefused)
	}
	image, err := d.bootImage(ctx, spec)
	if err != nil {
		return r, err
	}
	n, ok := cat.Network(spec.NetworkID)
	if !ok || n.Region != rid || n.OrganizationID != spec.OrganizationID || n.ProjectID != spec.ProjectID || spec.RegionID != rid {
		return r, fmt.Errorf("network %q is not a network of project %s/%s in region %s: %w",
			spec.NetworkID, spec.OrganizationID, spec.ProjectID, rid, region.ErrRefused)
	}
	r.image = image
	if r.flavor, err = d.cloudID(ctx, kindFlavor, f.ID, f.OpenStack); err != nil {
		return r, err
	}
	if r.network, err = d.cloudID(ctx, kindNetwork, n.ID, n.OpenStack); err != nil {
		return r, err
	}
	r.groups, err = d.resolveGroups(ctx, spec.NetworkID, spec.Networking.SecurityGroupIDs)
	return r, err
}

// bootImage is the cloud's image of the spec's: a catalogue image of the region, or a READY
// snapshot of the spec's project.
func (d *Driver) bootImage(ctx context.Context, spec region.ServerSpec) (string, error) {
	rid := d.opts.Region.ID
	if im, ok := d.opts.Catalog.Image(spec.ImageID); ok {
		if !im.OfferedIn(rid) {
			return "", fmt.Errorf("image %q is not offered in region %s: %w", spec.ImageID, rid, region.ErrRefused)
		}
		return d.cloudID(ctx, kindImage, im.ID, im.OpenStack)
	}
	snap, err := d.snapshotOf(ctx, spec.OrganizationID, spec.ProjectID, spec.ImageID)
	if errors.Is(err, region.ErrImageNotFound) {
		return "", fmt.Errorf("image %q is not offered in region %s: %w", spec.ImageID, rid, region.ErrRefused)
	}
	if err != nil {
		return "", err
	}
	if state := imageState(snap.Status); state != region.ImageStateReady {
		return "", fmt.Errorf("image %q is %s, not ready: %w", spec.ImageID, state, region.ErrRefused)
	}
	return snap.ID, nil
}

// resolveGroups is the cloud's security groups of catalogue groups on the network.
func (d *Driver) resolveGroups(ctx context.Context, network string, ids []string) ([]string, error) {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		sg, ok := d.opts.Catalog.SecurityGroup(id)
		if !ok || sg.NetworkID != network {
			return nil, fmt.Errorf("security group %q is not a group of network %s: %w", id, network, region.ErrRefused)
		}
		cid, err := d.cloudID(ctx, kindSecurityGroup, sg.ID, sg.OpenStack)
		if err != nil {
			return nil, err
		}
		out = append(out, cid)
	}
	return out, nil
}

// checkNetworking refuses what the driver cannot give a server: a public IP in a region that
// names no external network, and source addresses Neutron's rules do not take as they are.
func (d *Driver) checkNetworking(n region.ServerNetworking) error {
	if n.PublicIP && !d.opts.Region.OffersPublicIPs() {
		return fmt.Errorf("this OpenStack region names no external network, and hands out no public IP addresses: %w", region.ErrRefused)
	}
	for _, s := range n.AllowedSourceAddresses {
		if p, err := netip.ParsePrefix(s); err != nil || !p.Addr().Is4() || p != p.Masked() {
			return fmt.Errorf("allowed source address %q is not an IPv4 prefix in canonical form: %w", s, region.ErrRefused)
		}
	}
	return nil
}

func (d *Driver) CreateServer(ctx context.Context, spec region.ServerSpec) (region.Server, error) {
	if err := d.checkNetworking(spec.Networking); err != nil {
		return region.Server{}, err
	}
	md, tags, desc, err := encodeSpec(spec)
	if err != nil {
		return region.Server{}, err
	}
	res, err := d.resolve(ctx, spec)
	if err != nil {
		return region.Server{}, err
	}
	caKey, err := d.caPublicKey(spec)
	if err != nil {
		return region.Server{}, err
	}
	userData, err := guestUserData(spec.UserData, caKey, spec.SSHPublicKeys)
	if err != nil {
		return region.Server{}, err
	}
	keyName := ""
	if spec.SSHCertificateAuthorityID == "" {
		if keyName, err = d.ensureKeyPair(ctx, spec.OrganizationID, spec.ProjectID); err != nil {
			return region.Server{}, err
		}
	}
	value := spec.Tags[region.InstanceTag]
	ref, err := d.keepLargeFields(ctx, largeFields{UserData: spec.UserData, SSHPublicKeys: spec.SSHPublicKeys})
	if err != nil {
		return region.Server{}, err
	}
	if ref != "" {
		md[metaLarge] = ref
	}
	var (
		group *groups.SecGroup
		port  *ports.Port
		made  *servers.Server
	)
	err = d.call(ctx, "create the security group of allowed sources", func(ctx context.Context, c *clients) error {
		group, err = groups.Create(ctx, c.network, groups.CreateOpts{Name: "computeql-allow-" + value, Description: desc}).Extract()
		return err
	})
	if err != nil {
		d.dropLargeFields(context.WithoutCancel(ctx), ref)
		return region.Server{}, err
	}
	// What the create made before it failed is removed, so a refused create leaves nothing.
	undo := func() {
		ctx := context.WithoutCancel(ctx)
		d.dropLargeFields(ctx, ref)
		if port != nil {
			if err := d.releaseFloatingIPs(ctx, port.ID); err != nil {
				d.log.Warn("openstack: left behind", "what", "floating IPs of port", "id", port.ID, "err", err)
			}
			d.deleteQuietly(ctx, "port", port.ID, func(ctx context.Context, c *clients) error {
				return ports.Delete(ctx, c.network, port.ID).ExtractErr()
			})
		}
		d.deleteQuietly(ctx, "security group", group.ID, func(ctx context.Context, c *clients) error {
			return groups.Delete(ctx, c.network, group.ID).ExtractErr()
		})
	}
	if err := d.setAllowed(ctx, group.ID, spec.Networking.AllowedSourceAddresses); err != nil {
		undo()
		return region.Server{}, err
	}
	sgs := append(slices.Clone(res.groups), group.ID)
	err = d.call(ctx, "create the server's port", func(ctx context.Context, c *clients) error {
		port, err = ports.Create(ctx, c.network, ports.CreateOpts{
			NetworkID: res.network, Name: "computeql-" + value, Description: desc, SecurityGroups: &sgs,
		}).Extract()
		return err
	})
	if err != nil {
		undo()
		return region.Server{}, notFoundAs(err, region.ErrRefused)
	}
	md[metaPort], md[metaAllowGroup] = port.ID, group.ID
	// The floating IP before the server, so that a server never runs without the address it
	// was asked with, and a pool or quota run out refuses the create with nothing left over.
	if spec.Networking.PublicIP {
		if err := d.addFloatingIP(ctx, port.ID, desc); err != nil {
			undo()
			return region.Server{}, err
		}
	}
	var opts servers.CreateOptsBuilder = createOpts{description: desc, CreateOptsBuilder: servers.CreateOpts{
		Name: spec.Name, FlavorRef: res.flavor, ImageRef: res.image, UserData: userData,
		Networks: []servers.Network{{Port: port.ID}}, Metadata: md, Tags: tags,
	}}
	if keyName != "" {
		opts = keypairs.CreateOptsExt{CreateOptsBuilder: opts, KeyName: keyName}
	}
	err = d.call(ctx, "create the server", func(ctx context.Context, c *clients) error {
		made, err = servers.Create(ctx, c.compute, opts, nil).Extract()
		return err
	})
	// A create the cloud may have carried out nonetheless (no answer, a 5xx) keeps the port:
	// a server without it would have no network, and one left over costs only an address.
	if err != nil && !errors.Is(err, region.ErrUnavailable) {
		undo()
	}
	if err != nil {
		return region.Server{}, notFoundAs(err, region.ErrRefused)
	}
	d.remember(region.Event{Kind: region.ServerUpdated, ServerID: made.ID, Scope: spec.Scope, Tags: spec.Tags}, true)
	srv, err := d.GetServer(ctx, made.ID)
	if err != nil {
		return region.Server{}, fmt.Errorf("openstack: read server %s after its create: %w", made.ID, err)
	}
	return srv, nil
}

// notFoundAs turns a 404 of the cloud into err's sentinel: a flavor, image or network the
// catalogue names but the cloud does not have.
func notFoundAs(err, sentinel error) error {
	if errors.Is(err, errNotFound) {
		return fmt.Errorf("%w: %w", err, sentinel)
	}
	return err
}

// deleteQuietly deletes what a failed or finished operation leaves, logging what it cannot.
func (d *Driver) deleteQuietly(ctx context.Context, what, id string, del func(context.Context, *clients) error) {
	if err := d.call(ctx, "delete "+what+" "+id, del); err != nil && !errors.Is(err, errNotFound) {
		d.log.Warn("openstack: left behind", "what", what, "id", id, "err", err)
	}
}

// setAllowed makes the group's ingress rules the allowed source addresses.
func (d *Driver) setAllowed(ctx context.Context, groupID string, allowed []string) error {
	var have []rules.SecGroupRule
	err := d.call(ctx, "list the rules of allowed sources", func(ctx context.Context, c *clients) error {
		pages, err := rules.List(c.network, rules.ListOpts{SecGroupID: groupID, Direction: string(rules.DirIngress)}).AllPages(ctx)
		if err != nil {
			return err
		}
		have, err = rules.ExtractRules(pages)
		return err
	})
	if err != nil {
		return err
	}
	for _, r := range have {
		if slices.Contains(allowed, r.RemoteIPPrefix) {
			continue
		}
		err := d.call(ctx, "delete a rule of allowed sources", func(ctx context.Context, c *clients) error {
			return rules.Delete(ctx, c.network, r.ID).ExtractErr()
		})
		if err != nil && !errors.Is(err, errNotFound) {
			return err
		}
	}
	for _, prefix := range allowed {
		if slices.ContainsFunc(have, func(r rules.SecGroupRule) bool { return r.RemoteIPPrefix == prefix }) {
			continue
		}
		err := d.call(ctx, "add a rule of allowed sources", func(ctx context.Context, c *clients) error {
			_, err := rules.Create(ctx, c.network, rules.CreateOpts{
				Direction: rules.DirIngress, EtherType: rules.EtherType4, SecGroupID: groupID, RemoteIPPrefix: prefix,
			}).Extract()
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// nova returns a server of the region from Nova; another one, or none, is ErrServerNotFound.
func (d *Driver) nova(ctx context.Context, id string) (*servers.Server, error) {
	var s *servers.Server
	err := d.call(ctx, "read server "+id, func(ctx context.Context, c *clients) error {
		var err error
		s, err = servers.Get(ctx, c.compute, id).Extract()
		return err
	})
	switch {
	case errors.Is(err, errNotFound):
		return nil, fmt.Errorf("server %s: %w", id, region.ErrServerNotFound)
	case err != nil:
		return nil, err
	case deleted(s):
		return nil, fmt.Errorf("server %s is deleted: %w", id, region.ErrServerNotFound)
	case s.Metadata[metaRegion] != d.opts.Region.ID || s.Metadata[metaInstance] == "":
		return nil, fmt.Errorf("server %s is not a server of region %s: %w", id, d.opts.Region.ID, region.ErrServerNotFound)
	}
	return s, nil
}

// deleted reports a server Nova has deleted but still shows: to an admin, and, between the
// compute host marking it deleted and Nova forgetting its row, in any listing (tags included).
func deleted(s *servers.Server) bool {
	return s.Status == "DELETED" || s.Status == "SOFT_DELETED"
}

func (d *Driver) GetServer(ctx context.Context, id string) (region.Server, error) {
	s, err := d.nova(ctx, id)
	if err != nil {
		return region.Server{}, err
	}
	return d.withPort(ctx, s)
}

// withPort is the server with its port's address and MAC (a port gone already, the server on
// its way out, leaves them empty) and the user data and SSH keys it was made with.
func (d *Driver) withPort(ctx context.Context, s *servers.Server) (region.Server, error) {
	large, err := d.largeFields(ctx, s.Metadata[metaLarge])
	if err != nil {
		return region.Server{}, err
	}
	var p *ports.Port
	if id := s.Metadata[metaPort]; id != "" {
		err := d.call(ctx, "read port "+id, func(ctx context.Context, c *clients) error {
			var err error
			p, err = ports.Get(ctx, c.network, id).Extract()
			return err
		})
		if err != nil && !errors.Is(err, errNotFound) {
			return region.Server{}, err
		}
	}
	srv := toServer(s, p)
	srv.UserData, srv.SSHPublicKeys = large.UserData, large.SSHPublicKeys
	if p != nil {
		if srv.PublicIP, err = d.publicIP(ctx, p.ID); err != nil {
			return region.Server{}, err
		}
	}
	return srv, nil
}

// toServer is the region's view of a Nova server and its port.
func toServer(s *servers.Server, p *ports.Port) region.Server {
	spec := decodeSpec(s.Metadata)
	spec.Name = s.Name
	state, msg := serverState(s.Status, s.TaskState, int(s.PowerState), s.Fault.Message)
	srv := region.Server{ID: s.ID, ServerSpec: spec, State: state, Health: health(state), Message: msg, CreatedAt: s.Created.UTC()}
	if p != nil {
		srv.MAC = p.MACAddress
		for _, ip := range p.FixedIPs {
			if a, err := netip.ParseAddr(ip.IPAddress); err == nil && a.Is4() {
				srv.PrivateIP = ip.IPAddress
				break
			}
		}
	}
	return srv
}

func (d *Driver) FindServers(ctx context.Context, scope region.Scope, tag, value string) ([]region.Server, error) {
	if tag != region.InstanceTag {
		return nil, fmt.Errorf("servers are found by %s only, not by %s: %w", region.InstanceTag, tag, region.ErrRefused)
	}
	novaTag, err := novaTag(value)
	if err != nil {
		// No server was made with such a value.
		return nil, nil
	}
	var found []servers.Server
	err = d.call(ctx, "find servers by tag "+novaTag, func(ctx context.Context, c *clients) error {
		pages, err := servers.List(c.compute, servers.ListOpts{Tags: novaTag}).AllPages(ctx)
		if err != nil {
			return err
		}
		found, err = servers.ExtractServers(pages)
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []region.Server
	for i := range found {
		s := &found[i]
		if deleted(s) || decodeSpec(s.Metadata).Scope != scope || s.Metadata[metaInstance] != value {
			continue
		}
		srv, err := d.withPort(ctx, s)
		if err != nil {
			return nil, err
		}
		out = append(out, srv)
	}
	return out, nil
}

// Servers lists every server of the region, for audits and the collection of orphans, with
// their ports' addresses and MACs from one listing of Neutron's ports (floating IPs are left
// out: they would cost a call per server).
func (d *Driver) Servers(ctx context.Context) ([]region.Server, error) {
	var list []*servers.Server
	err := d.call(ctx, "list servers", func(ctx context.Context, c *clients) error {
		return servers.List(c.compute, nil).EachPage(ctx, func(ctx context.Context, page pagination.Page) (bool, error) {
			got, err := servers.ExtractServers(page)
			for i := range got {
				if s := &got[i]; !deleted(s) && s.Metadata[metaRegion] == d.opts.Region.ID && s.Metadata[metaInstance] != "" {
					list = append(list, s)
				}
			}
			return true, err
		})
	})
	if err != nil || len(list) == 0 {
		return nil, err
	}
	byID := map[string]*ports.Port{}
	err = d.call(ctx, "list ports", func(ctx context.Context, c *clients) error {
		return ports.List(c.network, ports.ListOpts{}).EachPage(ctx, func(ctx context.Context, page pagination.Page) (bool, error) {
			got, err := ports.ExtractPorts(page)
			for i := range got {
				byID[got[i].ID] = &got[i]
			}
			return true, err
		})
	})
	if err != nil {
		return nil, err
	}
	out := make([]region.Server, len(list))
	for i, s := range list {
		out[i] = toServer(s, byID[s.Metadata[metaPort]])
	}
	return out, nil
}

func (d *Driver) UpdateNetworking(ctx context.Context, id string, n region.ServerNetworking) (region.Server, error) {
	s, err := d.nova(ctx, id)
	if err != nil {
		return region.Server{}, err
	}
	if err := d.checkNetworking(n); err != nil {
		return region.Server{}, err
	}
	groupIDs, err := d.resolveGroups(ctx, s.Metadata[metaNetwork], n.SecurityGroupIDs)
	if err != nil {
		return region.Server{}, err
	}
	portID, allow := s.Metadata[metaPort], s.Metadata[metaAllowGroup]
	if err := d.setAllowed(ctx, allow, n.AllowedSourceAddresses); err != nil {
		return region.Server{}, err
	}
	sgs := append(groupIDs, allow)
	err = d.call(ctx, "set the security groups of port "+portID, func(ctx context.Context, c *clients) error {
		_, err := ports.Update(ctx, c.network, portID, ports.UpdateOpts{SecurityGroups: &sgs}).Extract()
		return err
	})
	if err != nil {
		return region.Server{}, err
	}
	if d.opts.Region.OffersPublicIPs() {
		desc := describe(decodeSpec(s.Metadata).Scope, s.Metadata[metaInstance])
		if err := d.setFloatingIP(ctx, portID, desc, n.PublicIP); err != nil {
			return region.Server{}, err
		}
	}
	// The record last, once the cloud enforces it; it also moves the server's updated time,
	// which is how the watch learns of the change.
	if err := d.recordNetworking(ctx, id, n); err != nil {
		return region.Server{}, err
	}
	return d.GetServer(ctx, id)
}

// recordNetworking writes the networking into the server's metadata. Nova takes no metadata
// while the server is building or in the middle of a task (409): the write is tried again
// until the request timeout, then the caller is told to retry (ErrUnavailable), the cloud
// enforcing the new networking already.
func (d *Driver) recordNetworking(ctx context.Context, id string, n region.ServerNetworking) error {
	ctx, cancel := context.WithTimeout(ctx, d.requestTimeout)
	defer cancel()
	tick := time.NewTicker(resizePoll)
	defer tick.Stop()
	for {
		err := d.call(ctx, "record the networking of server "+id, func(ctx context.Context, c *clients) error {
			_, err := servers.UpdateMetadata(ctx, c.compute, id, servers.MetadataOpts(encodeNetworking(n))).Extract()
			return err
		})
		if err == nil || !isConflict(err) {
			return notFoundAs(err, region.ErrServerNotFound)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("openstack: server %s is busy, its networking is enforced but not yet recorded (%s): %w",
				id, region.Reason(err, region.ErrRefused), region.ErrUnavailable)
		case <-tick.C:
		}
	}
}

func (d *Driver) DeleteServer(ctx context.Context, id string) error {
	s, err := d.nova(ctx, id)
	if errors.Is(err, region.ErrServerNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	err = d.call(ctx, "delete server "+id, func(ctx context.Context, c *clients) error {
		return servers.Delete(ctx, c.compute, id).ExtractErr()
	})
	if err != nil && !errors.Is(err, errNotFound) {
		return err
	}
	// Nova leaves a port it did not make; its floating IPs, the port, then the group it used,
	// go with the server.
	if portID := s.Metadata[metaPort]; portID != "" {
		// A cloud without Neutron's L3 API (404) has no floating IPs to release.
		if err := d.releaseFloatingIPs(ctx, portID); err != nil && !errors.Is(err, errNotFound) {
			return err
		}
		err := d.call(ctx, "delete port "+portID, func(ctx context.Context, c *clients) error {
			return ports.Delete(ctx, c.network, portID).ExtractErr()
		})
		if err != nil && !errors.Is(err, errNotFound) {
			return err
		}
	}
	if group := s.Metadata[metaAllowGroup]; group != "" {
		err := d.call(ctx, "delete security group "+group, func(ctx context.Context, c *clients) error {
			return groups.Delete(ctx, c.network, group).ExtractErr()
		})
		if err != nil && !errors.Is(err, errNotFound) {
			return err
		}
	}
	if ref := s.Metadata[metaLarge]; ref != "" {
		if err := d.opts.Redis.Del(ctx, largeKey(d.opts.Region.ID, ref)).Err(); err != nil {
			return fmt.Errorf("openstack: delete the user data of server %s: %w: %w", id, err, region.ErrUnavailable)
		}
	}
	return nil
}

// act runs a verb on a server that is in the state it needs, and returns the server as the
// cloud then has it: in its transitional state.
func (d *Driver) act(ctx context.Context, id string, need region.ServerState, verb string, f func(context.Context, *clients) error) (region.Server, error) {
	srv, err := d.GetServer(ctx, id)
	if err != nil {
		return region.Server{}, err
	}
	if srv.State != need {
		return region.Server{}, fmt.Errorf("server %s is %s; only a %s server can be %s: %w", id, srv.State, need, verb, region.ErrRefused)
	}
	if err := d.call(ctx, verb+" server "+id, f); err != nil {
		return region.Server{}, notFoundAs(err, region.ErrServerNotFound)
	}
	// Nova's updated time has whole seconds: a server back where it was within the second it
	// left would look unchanged to the watch, which must report the verb's end all the same.
	d.remember(region.Event{Kind: region.ServerUpdated, ServerID: id, Scope: srv.Scope, Tags: srv.Tags}, false)
	return d.GetServer(ctx, id)
}

func (d *Driver) StartServer(ctx context.Context, id string) (region.Server, error) {
	return d.act(ctx, id, region.ServerStopped, "started", func(ctx context.Context, c *clients) error {
		return servers.Start(ctx, c.compute, id).ExtractErr()
	})
}

func (d *Driver) StopServer(ctx context.Context, id string) (region.Server, error) {
	return d.act(ctx, id, region.ServerRunning, "stopped", func(ctx context.Context, c *clients) error {
		return servers.Stop(ctx, c.compute, id).ExtractErr()
	})
}

func (d *Driver) RebootServer(ctx context.Context, id string, hard bool) (region.Server, error) {
	how := servers.SoftReboot
	if hard {
		how = servers.HardReboot
	}
	return d.act(ctx, id, region.ServerRunning, "rebooted", func(ctx context.Context, c *clients) error {
		return servers.Reboot(ctx, c.compute, id, servers.RebootOpts{Type: how}).ExtractErr()
	})
}

// resizeTimeout bounds a resize from its request to its confirmation.
const resizeTimeout = 5 * time.Minute

// resizePoll is how often a resize's progress is read.
const resizePoll = 250 * time.Millisecond

func (d *Driver) ResizeServer(ctx context.Context, id, flavorID string) (region.Server, error) {
	srv, err := d.GetServer(ctx, id)
	if err != nil {
		return region.Server{}, err
	}
	if srv.State != region.ServerStopped {
		return region.Server{}, fmt.Errorf("server %s is %s; only a STOPPED server can be resized: %w", id, srv.State, region.ErrRefused)
	}
	cat := d.opts.Catalog
	to, ok := cat.Flavor(flavorID)
	if !ok || !to.OfferedIn(d.opts.Region.ID) {
		return region.Server{}, fmt.Errorf("flavor %q is not offered in region %s: %w", flavorID, d.opts.Region.ID, region.ErrRefused)
	}
	from, ok := cat.Flavor(srv.FlavorID)
	if !ok {
		return region.Server{}, fmt.Errorf("server %s has flavor %q, which the catalogue no longer has: %w", id, srv.FlavorID, region.ErrRefused)
	}
	if flavorID == srv.FlavorID {
		return srv, nil
	}
	fromID, err := d.cloudID(ctx, kindFlavor, from.ID, from.OpenStack)
	if err != nil {
		return region.Server{}, err
	}
	toID, err := d.cloudID(ctx, kindFlavor, to.ID, to.OpenStack)
	if err != nil {
		return region.Server{}, err
	}
	var fromDisk, toDisk int
	err = d.call(ctx, "read flavors", func(ctx context.Context, c *clients) error {
		for _, f := range []struct {
			id   string
			disk *int
		}{{fromID, &fromDisk}, {toID, &toDisk}} {
			fl, err := flavors.Get(ctx, c.compute, f.id).Extract()
			if err != nil {
				return err
			}
			*f.disk = fl.Disk
		}
		return nil
	})
	if err != nil {
		return region.Server{}, notFoundAs(err, region.ErrRefused)
	}
	if toDisk < fromDisk {
		return region.Server{}, fmt.Errorf("flavor %s has a %d GB disk, smaller than the server's %d GB: %w", flavorID, toDisk, fromDisk, region.ErrRefused)
	}
	err = d.call(ctx, "resize server "+id, func(ctx context.Context, c *clients) error {
		return servers.Resize(ctx, c.compute, id, servers.ResizeOpts{FlavorRef: toID}).ExtractErr()
	})
	if err != nil {
		return region.Server{}, notFoundAs(err, region.ErrServerNotFound)
	}
	ctx, cancel := context.WithTimeout(ctx, resizeTimeout)
	defer cancel()
	// Nova moves the server to VERIFY_RESIZE once it is on its new flavor; a resize that found
	// no room ends where it began, the fault saying why.
	_, err = d.until(ctx, id, func(s *servers.Server) (bool, error) {
		switch {
		case s.Status == "VERIFY_RESIZE":
			return true, nil
		case s.Status == "ERROR":
			return false, fmt.Errorf("resize of server %s failed: %s: %w", id, s.Fault.Message, region.ErrNoCapacity)
		case s.TaskState == "" && s.Status == "SHUTOFF":
			msg := s.Fault.Message
			if msg == "" {
				msg = "the cloud found no host for flavor " + flavorID
			}
			return false, fmt.Errorf("resize of server %s: %s: %w", id, msg, region.ErrNoCapacity)
		}
		return false, nil
	})
	if err != nil {
		return region.Server{}, err
	}
	err = d.call(ctx, "confirm the resize of server "+id, func(ctx context.Context, c *clients) error {
		return servers.ConfirmResize(ctx, c.compute, id).ExtractErr()
	})
	if err != nil {
		return region.Server{}, err
	}
	if _, err := d.until(ctx, id, func(s *servers.Server) (bool, error) { return s.Status == "SHUTOFF" && s.TaskState == "", nil }); err != nil {
		return region.Server{}, err
	}
	err = d.call(ctx, "record the flavor of server "+id, func(ctx context.Context, c *clients) error {
		_, err := servers.UpdateMetadata(ctx, c.compute, id, servers.MetadataOpts{metaFlavor: flavorID}).Extract()
		return err
	})
	if err != nil {
		return region.Server{}, err
	}
	return d.GetServer(ctx, id)
}

// until reads the server until done says so, or fails.
func (d *Driver) until(ctx context.Context, id string, done func(*servers.Server) (bool, error)) (*servers.Server, error) {
	tick := time.NewTicker(resizePoll)
	defer tick.Stop()
	for {
		s, err := d.nova(ctx, id)
		if err != nil {
			return nil, err
		}
		ok, err := done(s)
		if err != nil || ok {
			return s, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("openstack: server %s: %w: %w", id, ctx.Err(), region.ErrUnavailable)
		case <-tick.C:
		}
	}
}

func (d *Driver) ConsoleOutput(ctx context.Context, id string, tailBytes int) (region.ConsoleOutput, error) {
	if _, err := d.nova(ctx, id); err != nil {
		return region.ConsoleOutput{}, err
	}
	if tailBytes <= 0 || tailBytes > region.ConsoleOutputMax {
		tailBytes = region.ConsoleOutputMax
	}
	var out string
	err := d.call(ctx, "read the console of server "+id, func(ctx context.Context, c *clients) error {
		var err error
		out, err = servers.ShowConsoleOutput(ctx, c.compute, id, servers.ShowConsoleOutputOpts{}).Extract()
		return err
	})
	if err != nil {
		return region.ConsoleOutput{}, notFoundAs(err, region.ErrServerNotFound)
	}
	return region.TailText([]byte(out), tailBytes, time.Now()), nil
}

func (d *Driver) SSHKey(ctx context.Context, id string) (region.SSHKey, error) {
	s, err := d.nova(ctx, id)
	if err != nil {
		return region.SSHKey{}, err
	}
	if s.Metadata[metaSSHCA] != "" {
		return region.SSHKey{}, fmt.Errorf("server %s trusts an SSH certificate authority, not the project key pair: %w", id, region.ErrRefused)
	}
	key, err := d.projectKey(ctx, s.Metadata[metaOrg], s.Metadata[metaProject])
	if err != nil {
		return region.SSHKey{}, err
	}
	return region.SSHKey{PrivateKey: key}, nil
}
