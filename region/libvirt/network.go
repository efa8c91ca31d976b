package libvirt

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net/netip"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/region"
)

// networkName is the libvirt network of a catalogue network.
func networkName(n *region.Network) string { return namePrefix + n.ID }

// bridgeName is at most 15 characters, the kernel's limit, and the same for the same network
// on every process.
func bridgeName(n *region.Network) string {
	sum := sha256.Sum256([]byte(n.ID))
	return "cq" + hex.EncodeToString(sum[:])[:11]
}

// gateway is the host's address on the network: the prefix's first.
func gateway(p netip.Prefix) netip.Addr { return p.Masked().Addr().Next() }

// ensureNetwork returns the libvirt network of a catalogue network, defining and starting a
// NAT network with DHCP on its prefix when it is missing or inactive. Addresses are handed out
// only to the reservations the driver makes, one per server.
func (d *hostDriver) ensureNetwork(conn *golibvirt.Libvirt, n *region.Network) (golibvirt.Network, error) {
	name := networkName(n)
	net, err := conn.NetworkLookupByName(name)
	if isCode(err, golibvirt.ErrNoNetwork) {
		net, err = defineNetwork(conn, n)
	}
	if err != nil {
		return net, fmt.Errorf("look up network %s: %w", name, err)
	}
	active, err := conn.NetworkIsActive(net)
	if err != nil {
		return net, fmt.Errorf("network %s: %w", name, err)
	}
	if active == 0 {
		if err := conn.NetworkCreate(net); err != nil && !isCode(err, golibvirt.ErrOperationInvalid) {
			return net, fmt.Errorf("start network %s: %w", name, err)
		}
	}
	return net, nil
}

// defineNetwork defines the catalogue network's libvirt network, to start at the host's boot.
// When another process defined it a moment before (libvirt then says it exists with another
// uuid), theirs serves as well.
func defineNetwork(conn *golibvirt.Libvirt, n *region.Network) (golibvirt.Network, error) {
	name, gw := networkName(n), gateway(n.Prefix)
	def := libvirtxml.Network{
		Name:    name,
		Forward: &libvirtxml.NetworkForward{Mode: "nat"},
		Bridge:  &libvirtxml.NetworkBridge{Name: bridgeName(n), STP: "on", Delay: "0"},
		IPs: []libvirtxml.NetworkIP{{
			Address: gw.String(), Prefix: uint(n.Prefix.Bits()),
			// The range spans the prefix: libvirt caps dnsmasq's leases at the range's size
			// (plus the reservations there were at start), and a smaller range would turn away
			// the servers' reserved addresses. dnsmasq gives a reserved address to no other MAC,
			// and reserve skips addresses a stray client leased.
			DHCP: &libvirtxml.NetworkDHCP{Ranges: []libvirtxml.NetworkDHCPRange{{Start: gw.Next().String(), End: lastAddress(n.Prefix).Prev().String()}}},
		}},
	}
	doc, err := def.Marshal()
	if err != nil {
		return golibvirt.Network{}, err
	}
	net, err := conn.NetworkDefineXML(doc)
	if err != nil {
		theirs, lookErr := conn.NetworkLookupByName(name)
		if lookErr != nil {
			return net, fmt.Errorf("define network %s: %w", name, err)
		}
		return theirs, nil
	}
	_ = conn.NetworkSetAutostart(net, 1)
	return net, nil
}

// maxConflicts bounds the addresses tried that others took meanwhile (another process on
// the host, or another host of the region): more than a few means the refusal is of something
// else, or the network is all but full, which trying every address would not cure.
const maxConflicts = 8

// errNetworkFull: every address of the network's prefix is reserved or leased.
var errNetworkFull = fmt.Errorf("no free address: %w", region.ErrNoCapacity)

// reserve picks a free address of the prefix and reserves it for the MAC in the network's
// DHCP. An address is free when no reservation holds it and no lease does: dnsmasq would not
// hand out an address still leased to a deleted server's MAC. A reservation another process
// made meanwhile makes the host refuse ours, and the next address is tried; one another host
// of the region made meanwhile is found once ours is made, and ours is given back.
func (d *hostDriver) reserve(conn *golibvirt.Libvirt, net golibvirt.Network, n *region.Network, mac string) (string, error) {
	d.allocate.Lock()
	defer d.allocate.Unlock()
	used, err := usedAddresses(conn, net)
	if err != nil {
		return "", err
	}
	if d.elsewhere != nil {
		for ip := range d.elsewhere(net.Name) {
			used[ip] = true
		}
	}
	moved, conflicts := 0, 0
	for {
		ip, ok := candidate(n.Prefix, used, mac, moved)
		if !ok {
			return "", errNetworkFull
		}
		used[ip.String()] = true // whatever comes of it, it is not tried again
		// No host name: names need not be unique across projects, and libvirt refuses a
		// second reservation with the same one. The guest learns its name from the seed.
		doc, err := xmlOf(libvirtxml.NetworkDHCPHost{MAC: mac, IP: ip.String()})
		if err != nil {
			return "", err
		}
		err = conn.NetworkUpdateCompat(net, golibvirt.NetworkUpdateCommandAddLast, golibvirt.NetworkSectionIPDhcpHost, -1, doc, affect(conn, net))
		if err == nil && d.elsewhere != nil {
			// Another host of the region may have taken it since it was read: looked at again
			// once ours is made, so that of two hosts reserving it at once at least one sees
			// the other's and moves on (both, when both look after both made theirs).
			if other, taken := d.elsewhere(net.Name)[ip.String()]; taken && !strings.EqualFold(other, mac) {
				if err := release(conn, net.Name, mac); err != nil {
					return "", fmt.Errorf("give back %s in network %s: %w", ip, net.Name, err)
				}
				if moved++; moved+conflicts == maxConflicts {
					return "", fmt.Errorf("reserve an address in network %s: the %d addresses tried were all taken meanwhile, %d of them by the region's other hosts: %w", net.Name, moved+conflicts, moved, region.ErrUnavailable)
				}
				continue
			}
		}
		if err == nil {
			return ip.String(), nil
		}
		if conflicts++; !isCode(err, golibvirt.ErrOperationInvalid) || moved+conflicts == maxConflicts {
			return "", fmt.Errorf("reserve %s in network %s: %w", ip, net.Name, err)
		}
	}
}

// candidate is the free address of the prefix (past its gateway, before its broadcast
// address) to try next for the MAC: the lowest, until the region's other hosts took one this
// reservation tried (moved of them); then the first free one from a point the MAC and moved
// decide. Two hosts reserving at once both try the same lowest address, both see the other's
// and both give theirs back: were both to go on to the next one, they could go on in step
// through the whole prefix, each step a network update on each host. From points of their own
// they part.
func candidate(p netip.Prefix, used map[string]bool, mac string, moved int) (netip.Addr, bool) {
	// The catalogue's prefixes are /8 to /30: at least one address is left once the
	// network's, the gateway's and the broadcast address are.
	first, count := gateway(p).Next(), uint32(1)<<(32-p.Bits())-3
	from := uint32(0)
	if moved > 0 {
		h := fnv.New32a()
		fmt.Fprintf(h, "%s/%d", strings.ToLower(mac), moved)
		from = h.Sum32() % count
	}
	for i := range count {
		ip := addrAdd(first, (from+i)%count)
		if !used[ip.String()] {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// addrAdd is the IPv4 address n past a.
func addrAdd(a netip.Addr, n uint32) netip.Addr {
	b := a.As4()
	v := binary.BigEndian.Uint32(b[:]) + n
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// release removes the MAC's reservation; a reservation already gone is no error.
func release(conn *golibvirt.Libvirt, netName, mac string) error {
	if netName == "" || mac == "" {
		return nil
	}
	net, hosts, err := reservationsOf(conn, netName)
	if err != nil {
		return err
	}
	for _, h := range hosts {
		if !strings.EqualFold(h.MAC, mac) {
			continue
		}
		doc, err := xmlOf(libvirtxml.NetworkDHCPHost{MAC: h.MAC, IP: h.IP, Name: h.Name})
		if err != nil {
			return err
		}
		if err := conn.NetworkUpdateCompat(net, golibvirt.NetworkUpdateCommandDelete, golibvirt.NetworkSectionIPDhcpHost, -1, doc, affect(conn, net)); err != nil {
			return fmt.Errorf("release %s in network %s: %w", h.IP, netName, err)
		}
	}
	return nil
}

// affect is where a reservation change applies: the running network too when it runs (an
// inactive network refuses a live change, which would make a delete fail for ever).
func affect(conn *golibvirt.Libvirt, net golibvirt.Network) golibvirt.NetworkUpdateFlags {
	if active, err := conn.NetworkIsActive(net); err == nil && active == 0 {
		return golibvirt.NetworkUpdateAffectConfig
	}
	return golibvirt.NetworkUpdateAffectLive | golibvirt.NetworkUpdateAffectConfig
}

// reservationsOf returns the network named and its DHCP reservations: none when the host has
// no such network.
func reservationsOf(conn *golibvirt.Libvirt, netName string) (golibvirt.Network, []libvirtxml.NetworkDHCPHost, error) {
	net, err := conn.NetworkLookupByName(netName)
	if isCode(err, golibvirt.ErrNoNetwork) {
		return net, nil, nil
	}
	if err != nil {
		return net, nil, err
	}
	hosts, err := reservations(conn, net)
	return net, hosts, err
}

func reservations(conn *golibvirt.Libvirt, net golibvirt.Network) ([]libvirtxml.NetworkDHCPHost, error) {
	doc, err := conn.NetworkGetXMLDesc(net, 0)
	if err != nil {
		return nil, fmt.Errorf("network %s: %w", net.Name, err)
	}
	var def libvirtxml.Network
	if err := def.Unmarshal(doc); err != nil {
		return nil, fmt.Errorf("network %s: %w", net.Name, err)
	}
	var hosts []libvirtxml.NetworkDHCPHost
	for _, ip := range def.IPs {
		if ip.DHCP != nil {
			hosts = append(hosts, ip.DHCP.Hosts...)
		}
	}
	return hosts, nil
}

func usedAddresses(conn *golibvirt.Libvirt, net golibvirt.Network) (map[string]bool, error) {
	hosts, err := reservations(conn, net)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, h := range hosts {
		used[h.IP] = true
	}
	leases, _, err := conn.NetworkGetDhcpLeases(net, nil, 1<<16, 0)
	if err != nil {
		return nil, fmt.Errorf("leases of network %s: %w", net.Name, err)
	}
	for _, l := range leases {
		used[l.Ipaddr] = true
	}
	return used, nil
}

// leased reports whether the guest with the MAC holds a lease of the address.
func leased(conn *golibvirt.Libvirt, netName, mac, ip string) (bool, error) {
	net, err := conn.NetworkLookupByName(netName)
	if err != nil {
		return false, err
	}
	leases, _, err := conn.NetworkGetDhcpLeases(net, golibvirt.OptString{strings.ToLower(mac)}, 16, 0)
	if err != nil {
		return false, err
	}
	for _, l := range leases {
		if l.Ipaddr == ip {
			return true, nil
		}
	}
	return false, nil
}

// lastAddress is the prefix's broadcast address.
func lastAddress(p netip.Prefix) netip.Addr {
	return addrAdd(p.Masked().Addr(), uint32(1)<<(32-p.Bits())-1)
}

// xmlOf marshals a network section for NetworkUpdate.
func xmlOf(host libvirtxml.NetworkDHCPHost) (string, error) {
	doc, err := host.Marshal()
	if err != nil {
		return "", fmt.Errorf("dhcp host: %w", err)
	}
	return doc, nil
}

// collectReservations releases the DHCP reservations of the region's networks that no domain
// on the host holds: what a process that died between reserving an address and defining the
// domain left behind. Reservations carry no time, so one is released only when it was
// already unowned at a pass at least orphanAge earlier: no create takes that long between the
// two steps.
func (d *hostDriver) collectReservations(conn *golibvirt.Libvirt) (int, error) {
	owned, err := domainMACs(conn)
	if err != nil {
		return 0, err
	}
	now, seen, released := d.opts.Now(), map[string]bool{}, 0
	for _, n := range d.opts.Catalog.Networks {
		if n.Region != d.opts.Region.ID {
			continue
		}
		net, err := conn.NetworkLookupByName(networkName(&n))
		if isCode(err, golibvirt.ErrNoNetwork) {
			continue
		}
		if err != nil {
			return released, fmt.Errorf("network %s: %w", networkName(&n), err)
		}
		hosts, err := reservations(conn, net)
		if err != nil {
			return released, err
		}
		for _, h := range hosts {
			mac := strings.ToLower(h.MAC)
			if owned[mac] {
				continue
			}
			key := "reservation|" + net.Name + "|" + mac
			seen[key] = true
			if !d.unownedLongEnough(key, now) {
				continue
			}
			if err := release(conn, net.Name, h.MAC); err != nil {
				return released, err
			}
			delete(d.unowned, key)
			released++
		}
	}
	d.forgetUnseen("reservation|", seen)
	return released, nil
}

// unownedLongEnough records that what key names was found unowned now, and reports whether a
// pass at least orphanAge earlier found it unowned already.
func (d *hostDriver) unownedLongEnough(key string, now time.Time) bool {
	first, known := d.unowned[key]
	if !known {
		d.unowned[key] = now
		return false
	}
	return now.Sub(first) >= orphanAge
}

// forgetUnseen drops the records of the kind (a key prefix) that this pass did not find
// unowned: owned again, or removed by someone else.
func (d *hostDriver) forgetUnseen(kind string, seen map[string]bool) {
	for key := range d.unowned {
		if strings.HasPrefix(key, kind) && !seen[key] {
			delete(d.unowned, key)
		}
	}
}

// domainMACs is the set of MAC addresses (lower case) of every domain defined on the host.
func domainMACs(conn *golibvirt.Libvirt) (map[string]bool, error) {
	doms, _, err := conn.ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, fmt.Errorf("list domains: %w", err)
	}
	macs := map[string]bool{}
	for _, dom := range doms {
		doc, err := conn.DomainGetXMLDesc(dom, 0)
		if golibvirt.IsNotFound(err) {
			continue // undefined meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("domain %s: %w", dom.Name, err)
		}
		var def libvirtxml.Domain
		if err := def.Unmarshal(doc); err != nil {
			return nil, fmt.Errorf("domain %s: %w", dom.Name, err)
		}
		if def.Devices == nil {
			continue
		}
		for _, nic := range def.Devices.Interfaces {
			if nic.MAC != nil {
				macs[strings.ToLower(nic.MAC.Address)] = true
			}
		}
	}
	return macs, nil
}
