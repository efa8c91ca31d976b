package region

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/computeql/computeql/quota"
)

// catalogID is idPattern written out by hand, so the fuzzer compares two readings of it.
func catalogID(s string) bool {
	if len(s) < 1 || len(s) > 63 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		lowerOrDigit := 'a' <= c && c <= 'z' || '0' <= c && c <= '9'
		if !lowerOrDigit && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}

// FuzzParse: Parse never panics; a refused catalogue says why with every problem prefixed
// "catalog:"; an accepted one keeps every rule the instance code relies on without checking
// again (ids fit Redis keys, references resolve, quota has every kind, lookups return the
// entry named), and its JSON form parses back to the same catalogue.
func FuzzParse(f *testing.F) {
	f.Add(demoJSON)
	small, err := json.Marshal(base())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(small)
	for _, s := range []string{
		`{}`, `{} {}`, `[]`, `null`, `{"regions":[{"id":"eu","name":"EU"},{"id":"eu","name":"EU"}]}`,
		`{"regions":[{"id":"EU","name":"x"}]}`, `{"regions":[{"id":"a{b}","name":"x"}]}`, `{"regionz":[]}`,
		`{"organizations":[{"id":"o","name":"O","projects":[],"quota":{"servers":-1,"cpu":3}}]}`,
		`{"regions":[{"id":"eu","name":"EU"}],"organizations":[{"id":"o","name":"O","projects":[{"id":"p","name":"P"}]}],` +
			`"networks":[{"id":"n","name":"N","organizationId":"o","projectId":"p","region":"eu","prefix":"10.0.0.1/24"}]}`,
		`{"images":[{"id":"i","name":"I","architecture":"x86_64","sizeGiB":1,"virtualization":"any","state":"ready","regions":[],"tags":{}}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			var joined interface{ Unwrap() []error }
			parts := []error{err}
			if errors.As(err, &joined) {
				parts = joined.Unwrap()
			}
			for _, e := range parts {
				if !strings.HasPrefix(e.Error(), "catalog: ") {
					t.Fatalf("problem %q does not say it is the catalogue's", e)
				}
			}
			return
		}
		checkAccepted(t, c)
		first, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(first)
		if err != nil {
			t.Fatalf("accepted catalogue written back as JSON is refused: %v\n%s", err, first)
		}
		second, err := json.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, second) {
			t.Fatalf("catalogue changes when written and parsed again:\n%s\n%s", first, second)
		}
	})
}

// checkAccepted fails the test if an accepted catalogue breaks one of its rules.
func checkAccepted(t *testing.T, c *Catalog) {
	t.Helper()
	ids := map[string]map[string]bool{}
	id := func(kind, s string) {
		if !catalogID(s) || ids[kind][s] {
			t.Fatalf("%s id %q accepted: invalid or given twice", kind, s)
		}
		if ids[kind] == nil {
			ids[kind] = map[string]bool{}
		}
		ids[kind][s] = true
	}
	regions := func(what string, rs []string) {
		seen := map[string]bool{}
		for _, r := range rs {
			if _, ok := c.Region(r); !ok || seen[r] {
				t.Fatalf("%s offered in unknown or repeated region %q", what, r)
			}
			seen[r] = true
		}
		if len(rs) == 0 {
			t.Fatalf("%s is offered nowhere", what)
		}
	}
	for i := range c.Regions {
		id("region", c.Regions[i].ID)
		if r, ok := c.Region(c.Regions[i].ID); !ok || r != &c.Regions[i] {
			t.Fatalf("lookup of region %q misses its entry", c.Regions[i].ID)
		}
	}
	for i := range c.Organizations {
		o := &c.Organizations[i]
		id("organization", o.ID)
		if got, ok := c.Organization(o.ID); !ok || got != o {
			t.Fatalf("lookup of organization %q misses its entry", o.ID)
		}
		projects := map[string]bool{}
		for _, p := range o.Projects {
			if !catalogID(p.ID) || projects[p.ID] || !c.HasProject(o.ID, p.ID) {
				t.Fatalf("project %q of %q accepted: invalid, repeated or not found", p.ID, o.ID)
			}
			projects[p.ID] = true
		}
		if len(o.Quota) != len(quota.Kinds) {
			t.Fatalf("organization %q has quota %v, not one limit per kind", o.ID, o.Quota)
		}
		for _, k := range quota.Kinds {
			if v, ok := o.Quota[k]; !ok || v < 0 {
				t.Fatalf("organization %q quota %s = %d, %v", o.ID, k, v, ok)
			}
		}
	}
	for i := range c.Networks {
		n := &c.Networks[i]
		id("network", n.ID)
		_, inRegion := c.Region(n.Region)
		pf := n.Prefix
		switch got, ok := c.Network(n.ID); {
		case !ok || got != n:
			t.Fatalf("lookup of network %q misses its entry", n.ID)
		case !c.HasProject(n.OrganizationID, n.ProjectID) || !inRegion:
			t.Fatalf("network %q accepted in unknown project %s/%s or region %q", n.ID, n.OrganizationID, n.ProjectID, n.Region)
		case !pf.IsValid() || !pf.Addr().Is4() || pf.Bits() < 8 || pf.Bits() > 30 || pf != pf.Masked():
			t.Fatalf("network %q accepted with prefix %s", n.ID, pf)
		}
	}
	for i := range c.SecurityGroups {
		sg := &c.SecurityGroups[i]
		id("securityGroup", sg.ID)
		if got, ok := c.SecurityGroup(sg.ID); !ok || got != sg {
			t.Fatalf("lookup of security group %q misses its entry", sg.ID)
		}
		if _, ok := c.Network(sg.NetworkID); !ok {
			t.Fatalf("security group %q accepted on unknown network %q", sg.ID, sg.NetworkID)
		}
	}
	for i := range c.SSHCertificateAuthorities {
		ca := &c.SSHCertificateAuthorities[i]
		id("sshCA", ca.ID)
		if got, ok := c.SSHCertificateAuthority(ca.ID); !ok || got != ca || !c.HasProject(ca.OrganizationID, ca.ProjectID) || ca.PublicKey == "" {
			t.Fatalf("SSH CA %q accepted unreachable, in an unknown project or without a key", ca.ID)
		}
	}
	for i := range c.Flavors {
		fl := &c.Flavors[i]
		id("flavor", fl.ID)
		if got, ok := c.Flavor(fl.ID); !ok || got != fl || fl.CPUs <= 0 || fl.MemoryGiB <= 0 || fl.DiskGB <= 0 ||
			fl.Architecture != ArchitectureX86_64 && fl.Architecture != ArchitectureAArch64 ||
			fl.GPU != nil && (fl.GPU.PhysicalCount <= 0 || fl.GPU.MemoryGiB <= 0 || fl.GPU.Vendor == "" || fl.GPU.Model == "") {
			t.Fatalf("flavor %+v accepted unreachable or with an impossible shape", fl)
		}
		regions("flavor "+fl.ID, fl.Regions)
	}
	for i := range c.Images {
		im := &c.Images[i]
		id("image", im.ID)
		switch got, ok := c.Image(im.ID); {
		case !ok || got != im || im.SizeGiB <= 0 || im.Architecture != ArchitectureX86_64 && im.Architecture != ArchitectureAArch64:
			t.Fatalf("image %+v accepted unreachable or with an impossible shape", im)
		case im.Virtualization != VirtualizationVirtualized && im.Virtualization != VirtualizationBaremetal && im.Virtualization != VirtualizationAny,
			im.State != ImageStatePending && im.State != ImageStateCreating && im.State != ImageStateReady && im.State != ImageStateFailed:
			t.Fatalf("image %q accepted with virtualization %q, state %q", im.ID, im.Virtualization, im.State)
		}
		regions("image "+im.ID, im.Regions)
	}
}
