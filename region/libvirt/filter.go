package libvirt

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/region"
)

// A server's traffic is filtered by a libvirt network filter of its own, computeql-<id>,
// referenced by its interface. The filter is made of the rules of the server's security groups
// and its allowed source addresses; redefining it (when the server's networking changes)
// applies at once to the running guest, without a reboot. nwfilter's "in" is traffic to the
// guest, "out" traffic from it. The filter is stateful: replies to an accepted connection pass
// both ways. What no rule accepts is dropped, IPv6 included (the region's networks are IPv4).
// Traffic between the host and a guest is not filtered.

// Filter rule priorities: lower ones are matched first.
const (
	priorityDHCP        = 100
	priorityEstablished = 200
	priorityRule        = 500
	priorityDrop        = 1000
)

func filterName(serverID string) string { return namePrefix + serverID }

// filterXML is the server's filter for its networking, as the catalogue's groups say.
func filterXML(cat *region.Catalog, serverID string, n region.ServerNetworking) (string, error) {
	// The server's id as the filter's uuid too: libvirt redefines a filter only under the uuid
	// it was first defined with.
	f := libvirtxml.NWFilter{Name: filterName(serverID), UUID: serverID, Chain: "root"}
	add := func(r libvirtxml.NWFilterRule) { f.Entries = append(f.Entries, libvirtxml.NWFilterEntry{Rule: &r}) }

	// The guest must get its address whatever its groups say.
	add(libvirtxml.NWFilterRule{Action: "accept", Direction: "out", Priority: priorityDHCP,
		UDP: &libvirtxml.NWFilterRuleUDP{NWFilterRuleCommonPort: ports(68, 68, 67, 67)}})
	add(libvirtxml.NWFilterRule{Action: "accept", Direction: "in", Priority: priorityDHCP,
		UDP: &libvirtxml.NWFilterRuleUDP{NWFilterRuleCommonPort: ports(67, 67, 68, 68)}})
	for _, dir := range []string{"in", "out"} {
		add(libvirtxml.NWFilterRule{Action: "accept", Direction: dir, Priority: priorityEstablished,
			All: &libvirtxml.NWFilterRuleAll{NWFilterRuleCommonIP: libvirtxml.NWFilterRuleCommonIP{State: str("ESTABLISHED,RELATED")}}})
	}

	var rules []region.SecurityGroupRule
	for _, id := range n.SecurityGroupIDs {
		sg, ok := cat.SecurityGroup(id)
		if !ok {
			return "", fmt.Errorf("security group %q does not exist: %w", id, region.ErrRefused)
		}
		rules = append(rules, sg.Rules...)
	}
	// An allowed source address reaches the guest on any protocol and port.
	for _, cidr := range n.AllowedSourceAddresses {
		if p, err := netip.ParsePrefix(cidr); err == nil && p.Addr().Is4() {
			rules = append(rules, region.SecurityGroupRule{Direction: region.DirectionIngress, Protocol: region.ProtocolAny, RemotePrefix: p.String()})
		}
	}
	egress := false
	for _, r := range rules {
		if r.Direction == region.DirectionEgress {
			egress = true
		}
		rule, err := filterRule(r)
		if err != nil {
			return "", err
		}
		add(rule)
	}
	if !egress {
		add(libvirtxml.NWFilterRule{Action: "accept", Direction: "out", Priority: priorityRule,
			All: &libvirtxml.NWFilterRuleAll{NWFilterRuleCommonIP: libvirtxml.NWFilterRuleCommonIP{State: str("NEW")}}})
	}
	add(libvirtxml.NWFilterRule{Action: "drop", Direction: "inout", Priority: priorityDrop, All: &libvirtxml.NWFilterRuleAll{}})
	add(libvirtxml.NWFilterRule{Action: "drop", Direction: "inout", Priority: priorityDrop, AllIPv6: &libvirtxml.NWFilterRuleAllIPv6{}})
	return f.Marshal()
}

// filterRule is a security group rule as an nwfilter rule accepting new connections.
func filterRule(r region.SecurityGroupRule) (libvirtxml.NWFilterRule, error) {
	prefix, err := netip.ParsePrefix(r.RemotePrefix)
	if err != nil {
		return libvirtxml.NWFilterRule{}, fmt.Errorf("rule's remote prefix %q: %w", r.RemotePrefix, err)
	}
	ip := libvirtxml.NWFilterRuleCommonIP{State: str("NEW")}
	remoteAddr, remoteMask := &ip.DstIPAddr, &ip.DstIPMask
	dir := "out"
	if r.Direction == region.DirectionIngress {
		remoteAddr, remoteMask, dir = &ip.SrcIPAddr, &ip.SrcIPMask, "in"
	}
	if prefix.Bits() > 0 {
		*remoteAddr, *remoteMask = str(prefix.Addr().String()), num(uint(prefix.Bits()))
	}
	rule := libvirtxml.NWFilterRule{Action: "accept", Direction: dir, Priority: priorityRule}
	var p libvirtxml.NWFilterRuleCommonPort
	if r.PortMin != 0 {
		p.DstPortStart, p.DstPortEnd = num(uint(r.PortMin)), num(uint(r.PortMax))
	}
	switch r.Protocol {
	case region.ProtocolTCP:
		rule.TCP = &libvirtxml.NWFilterRuleTCP{NWFilterRuleCommonIP: ip, NWFilterRuleCommonPort: p}
	case region.ProtocolUDP:
		rule.UDP = &libvirtxml.NWFilterRuleUDP{NWFilterRuleCommonIP: ip, NWFilterRuleCommonPort: p}
	case region.ProtocolICMP:
		rule.ICMP = &libvirtxml.NWFilterRuleICMP{NWFilterRuleCommonIP: ip}
	default:
		rule.All = &libvirtxml.NWFilterRuleAll{NWFilterRuleCommonIP: ip}
	}
	return rule, nil
}

func str(s string) libvirtxml.NWFilterField { return libvirtxml.NWFilterField{Str: s} }

// num is a number in decimal: libvirtxml writes a Uint field in hex, which libvirt refuses for
// masks.
func num(n uint) libvirtxml.NWFilterField { return str(strconv.FormatUint(uint64(n), 10)) }

// ports matches source ports srcMin-srcMax and destination ports dstMin-dstMax.
func ports(srcMin, srcMax, dstMin, dstMax uint) libvirtxml.NWFilterRuleCommonPort {
	return libvirtxml.NWFilterRuleCommonPort{SrcPortStart: num(srcMin), SrcPortEnd: num(srcMax), DstPortStart: num(dstMin), DstPortEnd: num(dstMax)}
}

// defineFilter defines (or redefines, applying it to the running guest) the server's filter.
func (d *hostDriver) defineFilter(conn *golibvirt.Libvirt, serverID string, n region.ServerNetworking) error {
	doc, err := filterXML(d.opts.Catalog, serverID, n)
	if err != nil {
		return err
	}
	if _, err := conn.NwfilterDefineXML(doc); err != nil {
		return fmt.Errorf("define network filter %s: %w", filterName(serverID), err)
	}
	return nil
}

// undefineFilter removes the server's filter; one already gone is no error.
func undefineFilter(conn *golibvirt.Libvirt, serverID string) error {
	f, err := conn.NwfilterLookupByName(filterName(serverID))
	if isCode(err, golibvirt.ErrNoNwfilter) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up network filter %s: %w", filterName(serverID), err)
	}
	if err := conn.NwfilterUndefine(f); err != nil && !isCode(err, golibvirt.ErrNoNwfilter) {
		return fmt.Errorf("undefine network filter %s: %w", filterName(serverID), err)
	}
	return nil
}

// collectFilters undefines the filters of servers whose domain does not exist: what a process
// that died between defining a server's filter and its domain left behind. Like reservations,
// one is undefined only when it was already unowned at a pass at least orphanAge earlier.
func (d *hostDriver) collectFilters(conn *golibvirt.Libvirt) (int, error) {
	filters, _, err := conn.ConnectListAllNwfilters(1, 0)
	if err != nil {
		return 0, fmt.Errorf("list network filters: %w", err)
	}
	now, seen, removed := d.opts.Now(), map[string]bool{}, 0
	for _, f := range filters {
		id, ok := strings.CutPrefix(f.Name, namePrefix)
		u, valid := parseUUID(id)
		if !ok || !valid {
			continue
		}
		if _, err := conn.DomainLookupByUUID(u); !golibvirt.IsNotFound(err) {
			continue // the server's, or the host could not say
		}
		key := "filter|" + f.Name
		seen[key] = true
		if !d.unownedLongEnough(key, now) {
			continue
		}
		if err := undefineFilter(conn, id); err != nil {
			return removed, err
		}
		delete(d.unowned, key)
		removed++
	}
	d.forgetUnseen("filter|", seen)
	return removed, nil
}
