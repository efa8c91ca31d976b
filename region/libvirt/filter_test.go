package libvirt

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/region"
)

// The filter a server's networking makes: its groups' rules and allowed source addresses as
// stateful accepts, DHCP and replies always through, egress open until a group restricts it,
// everything else dropped.
func TestFilterXML(t *testing.T) {
	cat, err := region.Parse([]byte(`{"regions": [{"id": "lab", "name": "Lab"}],
		"organizations": [{"id": "o", "name": "O", "projects": [{"id": "p", "name": "P"}]}],
		"networks": [{"id": "n", "name": "N", "region": "lab", "organizationId": "o", "projectId": "p", "prefix": "10.0.0.0/24"}],
		"securityGroups": [
			{"id": "ssh", "name": "ssh", "networkId": "n", "rules": [{"direction": "ingress", "protocol": "tcp", "portMin": 22, "portMax": 22, "remotePrefix": "192.0.2.0/24"}]},
			{"id": "dns-out", "name": "dns", "networkId": "n", "rules": [{"direction": "egress", "protocol": "udp", "portMin": 53, "portMax": 53},
				{"direction": "egress", "protocol": "icmp", "remotePrefix": "10.0.0.0/24"}]},
			{"id": "empty", "name": "empty", "networkId": "n"}],
		"sshCertificateAuthorities": [], "flavors": [], "images": []}`))
	if err != nil {
		t.Fatal(err)
	}
	const id = "6f1c2d3e-4f50-4b6f-8a4e-0c368a4e4d5e"
	always := []string{
		`<rule action="accept" direction="out" priority="100"><udp srcportstart="68" srcportend="68" dstportstart="67" dstportend="67"></udp></rule>`,
		`<rule action="accept" direction="in" priority="100"><udp srcportstart="67" srcportend="67" dstportstart="68" dstportend="68"></udp></rule>`,
		`<rule action="accept" direction="in" priority="200"><all state="ESTABLISHED,RELATED"></all></rule>`,
		`<rule action="accept" direction="out" priority="200"><all state="ESTABLISHED,RELATED"></all></rule>`,
	}
	drops := []string{
		`<rule action="drop" direction="inout" priority="1000"><all></all></rule>`,
		`<rule action="drop" direction="inout" priority="1000"><all-ipv6></all-ipv6></rule>`,
	}
	openEgress := `<rule action="accept" direction="out" priority="500"><all state="NEW"></all></rule>`
	for _, tc := range []struct {
		name       string
		networking region.ServerNetworking
		rules      []string
	}{
		{"no groups: nothing in, anything out", region.ServerNetworking{}, []string{openEgress}},
		{"a group without rules", region.ServerNetworking{SecurityGroupIDs: []string{"empty"}}, []string{openEgress}},
		{"an ingress port from a prefix", region.ServerNetworking{SecurityGroupIDs: []string{"ssh"}}, []string{
			`<rule action="accept" direction="in" priority="500"><tcp srcipaddr="192.0.2.0" srcipmask="24" state="NEW" dstportstart="22" dstportend="22"></tcp></rule>`,
			openEgress,
		}},
		{"egress rules close the rest of egress", region.ServerNetworking{SecurityGroupIDs: []string{"ssh", "dns-out"}}, []string{
			`<rule action="accept" direction="in" priority="500"><tcp srcipaddr="192.0.2.0" srcipmask="24" state="NEW" dstportstart="22" dstportend="22"></tcp></rule>`,
			`<rule action="accept" direction="out" priority="500"><udp state="NEW" dstportstart="53" dstportend="53"></udp></rule>`,
			`<rule action="accept" direction="out" priority="500"><icmp dstipaddr="10.0.0.0" dstipmask="24" state="NEW"></icmp></rule>`,
		}},
		{"allowed source addresses reach every port", region.ServerNetworking{AllowedSourceAddresses: []string{"198.51.100.0/24", "2001:db8::/32"}}, []string{
			`<rule action="accept" direction="in" priority="500"><all srcipaddr="198.51.100.0" srcipmask="24" state="NEW"></all></rule>`,
			openEgress,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := filterXML(cat, id, tc.networking)
			if err != nil {
				t.Fatal(err)
			}
			var f libvirtxml.NWFilter
			if err := f.Unmarshal(doc); err != nil {
				t.Fatal(err)
			}
			if f.Name != "computeql-"+id || f.UUID != id || f.Chain != "root" {
				t.Errorf("filter %q uuid %q chain %q", f.Name, f.UUID, f.Chain)
			}
			var got []string
			for _, e := range f.Entries {
				r, err := (&libvirtxml.NWFilter{Entries: []libvirtxml.NWFilterEntry{e}}).Marshal()
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, ruleOf(r))
			}
			want := append(append(append([]string{}, always...), tc.rules...), drops...)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
	if _, err := filterXML(cat, id, region.ServerNetworking{SecurityGroupIDs: []string{"gone"}}); err == nil {
		t.Error("a filter for a security group that does not exist was made")
	}
}

// ruleOf is the <rule> element of a one-rule filter document, on one line.
func ruleOf(doc string) string {
	start, end := strings.Index(doc, "<rule"), strings.LastIndex(doc, "</rule>")
	var b strings.Builder
	for _, line := range strings.Split(doc[start:end+len("</rule>")], "\n") {
		b.WriteString(strings.TrimSpace(line))
	}
	return b.String()
}
