package server

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/computeql/computeql/auth"
)

// TestInstanceQuery: instance(id:) and node(id:) (Relay's refetch) return an instance the
// caller may read; a malformed id is BAD_USER_INPUT (without echoing all of it back), and an
// instance that does not exist or that the caller may not read is NOT_FOUND with null.
func TestInstanceQuery(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	own := a.mustCreate(t, tok, createInput("mine"))
	admin := a.admin(t)
	otherProject := a.mustCreate(t, admin, with("theirs", map[string]any{"projectId": "data", "networkId": "net-acme-data-eu"}))
	otherOrg := a.mustCreate(t, admin, with("foreign", map[string]any{"organizationId": "globex", "projectId": "prod", "networkId": "net-globex-prod-eu"}))

	for _, form := range []struct{ field, q string }{
		{"instance", `query($id: ID!) { instance(id: $id) { id name organizationId projectId } }`},
		{"node", `query($id: ID!) { node(id: $id) { id __typename ... on Instance { name organizationId projectId } } }`},
	} {
		t.Run(form.field, func(t *testing.T) {
			q := form.q
			res := a.mustPost(t, tok, q, map[string]any{"id": own.ID})
			want := map[string]any{"id": own.ID, "name": "mine", "organizationId": "acme", "projectId": "web"}
			if form.field == "node" {
				want["__typename"] = "Instance"
			}
			if !reflect.DeepEqual(res.Data[form.field], want) {
				t.Errorf("%s = %v, want %v", form.field, res.Data[form.field], want)
			}
			viewer := a.token(t, "v", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleViewer})
			if res := a.mustPost(t, viewer, q, map[string]any{"id": own.ID}); res.Data[form.field] == nil {
				t.Error("a viewer cannot read an instance of its project")
			}

			tests := []struct {
				name string
				id   string
				code string
			}{
				{"word", "nope", "BAD_USER_INPUT"},
				{"SQL injection", "' OR 1=1", "BAD_USER_INPUT"},
				{"Redis glob", "*", "BAD_USER_INPUT"},
				{"10 KB", strings.Repeat("a", 10<<10), "BAD_USER_INPUT"},
				{"empty", "", "BAD_USER_INPUT"},
				{"UUID in braces", "{" + own.ID + "}", "BAD_USER_INPUT"},
				{"UUID URN", "urn:uuid:" + own.ID, "BAD_USER_INPUT"},
				{"UUID with a trailing newline", own.ID + "\n", "BAD_USER_INPUT"},
				{"unknown UUID", "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f", "NOT_FOUND"},
				{"other project", otherProject.ID, "NOT_FOUND"},
				{"other organization", otherOrg.ID, "NOT_FOUND"},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					res := a.post(t, tok, q, map[string]any{"id": tt.id})
					wantError(t, res, http.StatusOK, tt.code)
					if res.Data == nil || res.Data[form.field] != nil {
						t.Errorf("data = %v, want {%s: null}", res.Data, form.field)
					}
					if len(res.Errors) == 1 && len(res.Errors[0].Message) > 300 {
						t.Errorf("error message of %d bytes echoes the input", len(res.Errors[0].Message))
					}
				})
			}
		})
	}
}

type page struct {
	Edges []struct {
		Cursor string `json:"cursor"`
		Node   struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		} `json:"node"`
	} `json:"edges"`
	PageInfo struct {
		HasNextPage     bool    `json:"hasNextPage"`
		HasPreviousPage bool    `json:"hasPreviousPage"`
		StartCursor     *string `json:"startCursor"`
		EndCursor       *string `json:"endCursor"`
	} `json:"pageInfo"`
	TotalCount int `json:"totalCount"`
}

const listQuery = `query($org: ID!, $filter: InstanceFilter, $first: Int, $after: String) {
  instances(organizationId: $org, filter: $filter, first: $first, after: $after) {
    edges { cursor node { id name } }
    pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
    totalCount
  }
}`

func (a *api) list(tb testing.TB, token string, vars map[string]any) page {
	tb.Helper()
	if vars["org"] == nil {
		vars["org"] = "acme"
	}
	res := a.mustPost(tb, token, listQuery, vars)
	var p page
	decode(tb, res.Data["instances"], &p)
	return p
}

func names(p page) []string {
	out := []string{}
	for _, e := range p.Edges {
		out = append(out, e.Node.Name)
	}
	return out
}

// TestInstancesPagingVisitsEveryInstanceOnce: following endCursor with first:5 visits every
// instance the caller may read exactly once, oldest first, with totalCount on every page; both
// for an organization admin (the counted fast path) and a project member (the filtered scan).
func TestInstancesPagingVisitsEveryInstanceOnce(t *testing.T) {
	a := newAPI(t)
	admin := a.admin(t)
	var web []string
	for i := range 12 {
		name := fmt.Sprintf("web-%02d", i)
		a.mustCreate(t, admin, createInput(name))
		web = append(web, name)
		if i%4 == 0 { // interleave instances of another project
			a.mustCreate(t, admin, with(fmt.Sprintf("data-%02d", i), map[string]any{"projectId": "data", "networkId": "net-acme-data-eu"}))
		}
	}
	all := []string{}
	for _, n := range web {
		all = append(all, n)
		if n == "web-00" || n == "web-04" || n == "web-08" {
			all = append(all, "data-"+n[4:])
		}
	}

	tests := []struct {
		name  string
		token string
		want  []string
		pages []int
	}{
		{"organization admin", admin, all, []int{5, 5, 5}},
		{"project member", a.member(t), web, []int{5, 5, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			seen := map[string]bool{}
			var after any
			for n := 0; ; n++ {
				if n > len(tt.pages) {
					t.Fatalf("more than %d pages", len(tt.pages))
				}
				p := a.list(t, tt.token, map[string]any{"first": 5, "after": after})
				if p.TotalCount != len(tt.want) {
					t.Errorf("page %d: totalCount = %d, want %d", n, p.TotalCount, len(tt.want))
				}
				if len(p.Edges) != tt.pages[n] {
					t.Errorf("page %d has %d edges, want %d", n, len(p.Edges), tt.pages[n])
				}
				if p.PageInfo.HasPreviousPage != (n > 0) {
					t.Errorf("page %d: hasPreviousPage = %v", n, p.PageInfo.HasPreviousPage)
				}
				if len(p.Edges) > 0 && (deref(p.PageInfo.StartCursor) != p.Edges[0].Cursor || deref(p.PageInfo.EndCursor) != p.Edges[len(p.Edges)-1].Cursor) {
					t.Errorf("page %d: start/end cursors do not match the edges", n)
				}
				for _, e := range p.Edges {
					if seen[e.Node.ID] {
						t.Errorf("%s listed twice", e.Node.Name)
					}
					seen[e.Node.ID] = true
					got = append(got, e.Node.Name)
				}
				if !p.PageInfo.HasNextPage {
					if n != len(tt.pages)-1 {
						t.Errorf("hasNextPage false after %d pages, want %d", n+1, len(tt.pages))
					}
					break
				}
				after = *p.PageInfo.EndCursor
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("listed\n%v\nwant\n%v", got, tt.want)
			}
		})
	}

	// An exact multiple of the page size ends with hasNextPage false, not with an empty page.
	p := a.list(t, admin, map[string]any{"first": 15})
	if len(p.Edges) != 15 || p.PageInfo.HasNextPage {
		t.Errorf("first:15 of 15: %d edges, hasNextPage %v", len(p.Edges), p.PageInfo.HasNextPage)
	}
	// Without first, a page holds 20.
	if p := a.list(t, admin, map[string]any{}); len(p.Edges) != 15 {
		t.Errorf("default page has %d edges", len(p.Edges))
	}
}

// TestInstancesFilter: the filter narrows the listing and totalCount; given fields combine.
func TestInstancesFilter(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	tags := func(kv ...string) []map[string]any {
		var out []map[string]any
		for i := 0; i < len(kv); i += 2 {
			out = append(out, map[string]any{"name": kv[i], "value": kv[i+1]})
		}
		return out
	}
	a.mustCreate(t, tok, with("Web-Frontend", map[string]any{"tags": tags("env", "prod", "tier", "web")}))
	a.mustCreate(t, tok, with("web-backend", map[string]any{"tags": tags("env", "prod", "tier", "api")}))
	a.mustCreate(t, tok, with("db-main", map[string]any{"tags": tags("env", "staging"), "networkId": "net-acme-web-us"}))
	gone := a.mustCreate(t, tok, with("old-web", map[string]any{"tags": tags("env", "prod")}))
	if res, _ := a.remove(t, tok, gone.ID); len(res.Errors) > 0 {
		t.Fatal(res.Raw)
	}

	tests := []struct {
		name   string
		filter map[string]any
		want   []string
	}{
		{"none", nil, []string{"Web-Frontend", "web-backend", "db-main", "old-web"}},
		{"nameContains is case-insensitive", map[string]any{"nameContains": "WEB"}, []string{"Web-Frontend", "web-backend", "old-web"}},
		{"exact name", map[string]any{"name": "web-backend"}, []string{"web-backend"}},
		{"exact name is case-sensitive", map[string]any{"name": "web-frontend"}, []string{}},
		{"one tag", map[string]any{"tags": tags("env", "prod")}, []string{"Web-Frontend", "web-backend", "old-web"}},
		{"every tag must match", map[string]any{"tags": tags("env", "prod", "tier", "api")}, []string{"web-backend"}},
		{"tag value must match", map[string]any{"tags": tags("env", "dev")}, []string{}},
		{"tags and nameContains", map[string]any{"tags": tags("env", "prod"), "nameContains": "front"}, []string{"Web-Frontend"}},
		{"nameContains and a tag that excludes it", map[string]any{"tags": tags("env", "staging"), "nameContains": "web"}, []string{}},
		{"region", map[string]any{"region": "us-east"}, []string{"db-main"}},
		{"network", map[string]any{"networkId": "net-acme-web-eu"}, []string{"Web-Frontend", "web-backend", "old-web"}},
		{"project", map[string]any{"projectId": "web"}, []string{"Web-Frontend", "web-backend", "db-main", "old-web"}},
		{"provisioning status", map[string]any{"provisioningStatus": []string{"DEPROVISIONING"}}, []string{"old-web"}},
		{"several provisioning statuses", map[string]any{"provisioningStatus": []string{"PENDING", "ERROR"}}, []string{"Web-Frontend", "web-backend", "db-main"}},
		{"power state", map[string]any{"powerState": []string{"RUNNING"}}, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vars := map[string]any{"first": 2}
			if tt.filter != nil {
				vars["filter"] = tt.filter
			}
			var got []string
			total := -1
			for {
				p := a.list(t, tok, vars)
				got = append(got, names(p)...)
				if total >= 0 && p.TotalCount != total {
					t.Errorf("totalCount changed between pages: %d then %d", total, p.TotalCount)
				}
				total = p.TotalCount
				if !p.PageInfo.HasNextPage {
					break
				}
				vars["after"] = *p.PageInfo.EndCursor
			}
			if got == nil {
				got = []string{}
			}
			if !reflect.DeepEqual(got, tt.want) || total != len(tt.want) {
				t.Errorf("got %v (totalCount %d), want %v", got, total, tt.want)
			}
		})
	}
}

// TestInstancesArgumentErrors: page sizes outside 1..100 and cursors that are not this
// listing's are BAD_USER_INPUT; an organization or project the caller cannot read is NOT_FOUND.
func TestInstancesArgumentErrors(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	a.mustCreate(t, tok, createInput("x"))
	enc := base64.RawURLEncoding.EncodeToString
	tests := []struct {
		name string
		vars map[string]any
		code string
	}{
		{"first 0", map[string]any{"first": 0}, "BAD_USER_INPUT"},
		{"first negative", map[string]any{"first": -1}, "BAD_USER_INPUT"},
		{"first 101", map[string]any{"first": 101}, "BAD_USER_INPUT"},
		{"after garbage", map[string]any{"after": "garbage!"}, "BAD_USER_INPUT"},
		{"after valid base64 but no cursor", map[string]any{"after": enc([]byte("hello"))}, "BAD_USER_INPUT"},
		{"after cursor prefix with a bad id", map[string]any{"after": enc([]byte("i1:nope"))}, "BAD_USER_INPUT"},
		{"after 10 KB", map[string]any{"after": strings.Repeat("A", 10<<10)}, "BAD_USER_INPUT"},
		{"other organization", map[string]any{"org": "globex"}, "NOT_FOUND"},
		{"unknown organization", map[string]any{"org": "initech"}, "NOT_FOUND"},
		{"project the caller cannot read", map[string]any{"filter": map[string]any{"projectId": "data"}}, "NOT_FOUND"},
		// GraphQL validation accepts enum variables in any case, but only exact values bind:
		// a lower-case one must be refused, not match nothing.
		{"lower-case provisioning status", map[string]any{"filter": map[string]any{"provisioningStatus": []string{"pending"}}}, "BAD_USER_INPUT"},
		{"lower-case power state", map[string]any{"filter": map[string]any{"powerState": []string{"PENDING", "running"}}}, "BAD_USER_INPUT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.vars["org"] == nil {
				tt.vars["org"] = "acme"
			}
			res := a.post(t, tok, listQuery, tt.vars)
			wantError(t, res, http.StatusOK, tt.code)
			if len(res.Errors) == 1 && !reflect.DeepEqual(res.Errors[0].Path, []any{"instances"}) {
				t.Errorf("error path = %v", res.Errors[0].Path)
			}
		})
	}
	for _, first := range []int{1, 100} {
		if p := a.list(t, tok, map[string]any{"first": first}); len(p.Edges) != 1 {
			t.Errorf("first %d: %d edges", first, len(p.Edges))
		}
	}
	// A cursor of an instance that has since gone still pages on (after it, nothing).
	ghost := enc([]byte("i1:ffffffff-ffff-7fff-bfff-ffffffffffff"))
	if p := a.list(t, tok, map[string]any{"after": ghost}); len(p.Edges) != 0 || p.PageInfo.HasNextPage {
		t.Errorf("after the last possible id: %+v", p)
	}
}

// TestCatalogueQueriesAreScopedToGrants: regions, flavors and images are public; networks,
// security groups and SSH CAs are shown only where the caller holds a grant.
func TestCatalogueQueriesAreScopedToGrants(t *testing.T) {
	a := newAPI(t)
	webMember := a.member(t)
	acmeAdmin := a.token(t, "boss", auth.Grant{OrganizationID: "acme", Role: auth.RoleAdmin})
	globexViewer := a.token(t, "g", auth.Grant{OrganizationID: "globex", ProjectID: "staging", Role: auth.RoleViewer})

	ids := func(tb testing.TB, token, query, field string) []string {
		tb.Helper()
		res := a.mustPost(tb, token, query, nil)
		var items []struct {
			ID string `json:"id"`
		}
		decode(tb, res.Data[field], &items)
		out := []string{}
		for _, it := range items {
			out = append(out, it.ID)
		}
		return out
	}
	allFlavors := []string{"g1.small", "g1.medium", "g1.large", "gpu.a100x2", "bm.metal", "a1.medium"}
	allImages := []string{"ubuntu-24.04", "ubuntu-24.04-arm", "debian-12-metal", "rocky-9", "fedora-41", "windows-2022"}
	tests := []struct {
		name, token, query, field string
		want                      []string
	}{
		{"regions", globexViewer, `{ regions { id name } }`, "regions", []string{"eu-west", "us-east"}},
		{"flavors", webMember, `{ flavors { id } }`, "flavors", allFlavors},
		{"flavors of a region", webMember, `{ flavors(region: "us-east") { id } }`, "flavors", []string{"g1.small", "g1.medium", "g1.large", "bm.metal", "a1.medium"}},
		{"flavors of an unknown region", webMember, `{ flavors(region: "mars") { id } }`, "flavors", []string{}},
		{"images", globexViewer, `{ images { id } }`, "images", allImages},
		{"images of a region", webMember, `{ images(region: "eu-west") { id } }`, "images", allImages},
		{"networks of a project member", webMember, `{ networks { id } }`, "networks", []string{"net-acme-web-eu", "net-acme-web-us"}},
		{"networks of another org asked by a member", webMember, `{ networks(organizationId: "globex") { id } }`, "networks", []string{}},
		{"networks of another project asked by a member", webMember, `{ networks(organizationId: "acme", projectId: "data") { id } }`, "networks", []string{}},
		{"networks of an org admin", acmeAdmin, `{ networks { id } }`, "networks", []string{"net-acme-web-eu", "net-acme-web-us", "net-acme-data-eu", "net-acme-data-us"}},
		{"networks of one project for an org admin", acmeAdmin, `{ networks(projectId: "data") { id } }`, "networks", []string{"net-acme-data-eu", "net-acme-data-us"}},
		{"networks of a viewer", globexViewer, `{ networks { id } }`, "networks", []string{"net-globex-staging-eu", "net-globex-staging-us"}},
		{"security groups of a project member", webMember, `{ securityGroups { id } }`, "securityGroups",
			[]string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-web", "sg-acme-web-us-ssh", "sg-acme-web-us-web"}},
		{"security groups of one network", webMember, `{ securityGroups(networkId: "net-acme-web-us") { id } }`, "securityGroups",
			[]string{"sg-acme-web-us-ssh", "sg-acme-web-us-web"}},
		{"security groups of another org's network", webMember, `{ securityGroups(networkId: "net-globex-prod-eu") { id } }`, "securityGroups", []string{}},
		{"SSH CAs of a project member", webMember, `{ sshCertificateAuthorities { id } }`, "sshCertificateAuthorities", []string{"ca-acme-web"}},
		{"SSH CAs of an org admin", acmeAdmin, `{ sshCertificateAuthorities(organizationId: "acme") { id } }`, "sshCertificateAuthorities", []string{"ca-acme-web", "ca-acme-data"}},
		{"SSH CAs of another org", acmeAdmin, `{ sshCertificateAuthorities(organizationId: "globex") { id } }`, "sshCertificateAuthorities", []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ids(t, tt.token, tt.query, tt.field); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestCatalogueFieldsAsTheContractNamesThem: the catalogue types carry the documented fields,
// with enums upper case and the network prefix as a CIDR.
func TestCatalogueFieldsAsTheContractNamesThem(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	res := a.mustPost(t, tok, `{
  networks(projectId: "web") { id name organizationId projectId region prefix }
  securityGroups(networkId: "net-acme-web-eu") { id name networkId rules { direction protocol portMin portMax remotePrefix } }
  sshCertificateAuthorities { id name organizationId projectId }
  flavors { id name cpus memoryGiB diskGB architecture baremetal gpu { vendor model memoryGiB physicalCount } regions }
  images { id name architecture sizeGiB virtualization state os { family distro version } regions }
}`, nil)
	var got struct {
		Networks       []map[string]any `json:"networks"`
		SecurityGroups []map[string]any `json:"securityGroups"`
		CAs            []map[string]any `json:"sshCertificateAuthorities"`
		Flavors        []map[string]any `json:"flavors"`
		Images         []map[string]any `json:"images"`
	}
	decode(t, res.Data, &got)
	checks := []struct {
		what      string
		got, want any
	}{
		{"network", got.Networks[0], map[string]any{"id": "net-acme-web-eu", "name": "acme web (EU West)", "organizationId": "acme", "projectId": "web", "region": "eu-west", "prefix": "10.10.0.0/24"}},
		{"security group", got.SecurityGroups[1], map[string]any{"id": "sg-acme-web-eu-web", "name": "web", "networkId": "net-acme-web-eu", "rules": []any{
			map[string]any{"direction": "INGRESS", "protocol": "TCP", "portMin": 80.0, "portMax": 80.0, "remotePrefix": "0.0.0.0/0"},
			map[string]any{"direction": "INGRESS", "protocol": "TCP", "portMin": 443.0, "portMax": 443.0, "remotePrefix": "0.0.0.0/0"},
			map[string]any{"direction": "INGRESS", "protocol": "ICMP", "portMin": 0.0, "portMax": 0.0, "remotePrefix": "0.0.0.0/0"},
		}}},
		{"SSH CA", got.CAs[0], map[string]any{"id": "ca-acme-web", "name": "acme web users CA", "organizationId": "acme", "projectId": "web"}},
		{"flavor", got.Flavors[0], map[string]any{"id": "g1.small", "name": "General 1 small", "cpus": 2.0, "memoryGiB": 4.0, "diskGB": 20.0, "architecture": "X86_64", "baremetal": false, "gpu": nil, "regions": []any{"eu-west", "us-east"}}},
		{"GPU flavor", got.Flavors[3]["gpu"], map[string]any{"vendor": "NVIDIA", "model": "A100", "memoryGiB": 80.0, "physicalCount": 2.0}},
		{"arm flavor", got.Flavors[5]["architecture"], "AARCH64"},
		{"image", got.Images[0], map[string]any{"id": "ubuntu-24.04", "name": "Ubuntu 24.04 LTS", "architecture": "X86_64", "sizeGiB": 8.0, "virtualization": "ANY", "state": "READY",
			"os": map[string]any{"family": "linux", "distro": "ubuntu", "version": "24.04"}, "regions": []any{"eu-west", "us-east"}}},
		{"baremetal image", got.Images[2]["virtualization"], "BAREMETAL"},
		{"virtualized image", got.Images[3]["virtualization"], "VIRTUALIZED"},
		{"pending image", got.Images[4]["state"], "PENDING"},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
}

type gqlQuota struct {
	OrganizationID string `json:"organizationId"`
	Limits         []struct {
		Kind  string `json:"kind"`
		Limit int    `json:"limit"`
		Used  int    `json:"used"`
	} `json:"limits"`
}

func (q gqlQuota) String() string {
	var b strings.Builder
	for _, l := range q.Limits {
		fmt.Fprintf(&b, "%s=%d/%d ", l.Kind, l.Used, l.Limit)
	}
	return strings.TrimSpace(b.String())
}

// TestQuotaQuery: quota(organizationId) lists limit and usage of the five kinds, in order, to
// anyone with a grant in the organization, and is NOT_FOUND to others.
func TestQuotaQuery(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	a.mustCreate(t, tok, with("gpu", map[string]any{"flavorId": "gpu.a100x2", "networking": map[string]any{"publicIP": true}}))
	const q = `query($org: ID!) { quota(organizationId: $org) { organizationId limits { kind limit used } } }`
	res := a.mustPost(t, tok, q, map[string]any{"org": "acme"})
	var got gqlQuota
	decode(t, res.Data["quota"], &got)
	if want := "servers=1/50 gpus=2/4 publicIPs=1/10 cpus=16/256 memoryGiB=128/1024"; got.OrganizationID != "acme" || got.String() != want {
		t.Errorf("quota = %s %s, want acme %s", got.OrganizationID, got, want)
	}
	viewer := a.token(t, "v", auth.Grant{OrganizationID: "globex", ProjectID: "prod", Role: auth.RoleViewer})
	res = a.mustPost(t, viewer, q, map[string]any{"org": "globex"})
	decode(t, res.Data["quota"], &got)
	if want := "servers=0/20 gpus=0/0 publicIPs=0/4 cpus=0/64 memoryGiB=0/256"; got.String() != want {
		t.Errorf("globex quota = %s, want %s", got, want)
	}
	for _, org := range []string{"globex", "initech"} {
		wantError(t, a.post(t, tok, q, map[string]any{"org": org}), http.StatusOK, "NOT_FOUND")
	}
}

// TestSetQuota: organization admins set limits (the new limits show at once and bind the next
// create); anyone else is refused; invalid limits are userErrors naming the entry.
func TestSetQuota(t *testing.T) {
	a := newAPI(t)
	admin := a.token(t, "boss", auth.Grant{OrganizationID: "acme", Role: auth.RoleAdmin})
	const m = `mutation($org: ID!, $limits: [QuotaLimitInput!]!) {
  setQuota(input: {organizationId: $org, limits: $limits}) { quota { organizationId limits { kind limit used } } userErrors { field code message } }
}`
	limits := func(kv ...any) []map[string]any {
		var out []map[string]any
		for i := 0; i < len(kv); i += 2 {
			out = append(out, map[string]any{"kind": kv[i], "limit": kv[i+1]})
		}
		return out
	}

	res := a.mustPost(t, admin, m, map[string]any{"org": "acme", "limits": limits("servers", 1, "cpus", 100)})
	var p struct {
		Quota      *gqlQuota   `json:"quota"`
		UserErrors []userError `json:"userErrors"`
	}
	decode(t, res.Data["setQuota"], &p)
	if p.Quota == nil || len(p.UserErrors) != 0 || p.Quota.String() != "servers=0/1 gpus=0/4 publicIPs=0/10 cpus=0/100 memoryGiB=0/1024" {
		t.Fatalf("setQuota: %s", res.Raw)
	}
	a.mustCreate(t, admin, createInput("one"))
	cres, cp := a.create(t, admin, createInput("two"))
	wantUserErrors(t, cres, payload{Instance: cp.Instance, UserErrors: cp.UserErrors}, fc("QUOTA_EXCEEDED", "input", "flavorId"))

	refusals := []struct {
		name   string
		token  string
		org    string
		limits []map[string]any
		code   string
		want   []fieldCode
	}{
		{"project member", a.member(t), "acme", limits("servers", 100), "FORBIDDEN", nil},
		{"org-wide member", a.token(t, "m", auth.Grant{OrganizationID: "acme", Role: auth.RoleMember}), "acme", limits("servers", 100), "FORBIDDEN", nil},
		{"admin of another org", a.token(t, "g", auth.Grant{OrganizationID: "globex", Role: auth.RoleAdmin}), "acme", limits("servers", 100), "NOT_FOUND", nil},
		{"unknown org", admin, "initech", limits("servers", 100), "NOT_FOUND", nil},
		{"unknown kind", admin, "acme", limits("servers", 5, "disks", 5), "", []fieldCode{fc("BAD_USER_INPUT", "input", "limits", "1", "kind")}},
		{"kind twice", admin, "acme", limits("cpus", 5, "cpus", 6), "", []fieldCode{fc("BAD_USER_INPUT", "input", "limits", "1", "kind")}},
		{"negative limit", admin, "acme", limits("gpus", -1), "", []fieldCode{fc("BAD_USER_INPUT", "input", "limits", "0", "limit")}},
		{"limit too large", admin, "acme", limits("gpus", 1_000_000_001), "", []fieldCode{fc("BAD_USER_INPUT", "input", "limits", "0", "limit")}},
		{"no limits", admin, "acme", limits(), "", []fieldCode{fc("BAD_USER_INPUT", "input", "limits")}},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			before := a.storeState(t)
			lim := tt.limits
			if lim == nil {
				lim = []map[string]any{}
			}
			res := a.post(t, tt.token, m, map[string]any{"org": tt.org, "limits": lim})
			if tt.code != "" {
				wantError(t, res, http.StatusOK, tt.code)
			} else {
				var p struct {
					Quota      *gqlQuota   `json:"quota"`
					UserErrors []userError `json:"userErrors"`
				}
				decode(t, res.Data["setQuota"], &p)
				if p.Quota != nil {
					t.Errorf("refused setQuota returned a quota: %s", res.Raw)
				}
				wantUserErrors(t, res, payload{UserErrors: p.UserErrors}, tt.want...)
			}
			if !reflect.DeepEqual(before, a.storeState(t)) {
				t.Error("a refused setQuota changed Redis")
			}
		})
	}
}
