package instance_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"testing"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
)

// pageAll lists every page of req with page size first, checking HasNextPage on each, and
// returns the ids in listed order.
func pageAll(t *testing.T, e *env, ctx context.Context, req instance.ListRequest, first, wantTotal int) []string {
	t.Helper()
	req.First = ptr(first)
	var ids []string
	pages := 0
	for {
		page, err := e.svc.List(ctx, req)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		pages++
		if req.WantTotal && page.TotalCount != wantTotal {
			t.Fatalf("page %d: total %d, want %d", pages, page.TotalCount, wantTotal)
		}
		for _, inst := range page.Instances {
			ids = append(ids, inst.ID)
		}
		remaining := wantTotal - (len(ids) - len(page.Instances))
		if want := min(first, remaining); len(page.Instances) != want {
			t.Fatalf("page %d has %d instances, want %d", pages, len(page.Instances), want)
		}
		if page.HasNextPage != (remaining > first) {
			t.Fatalf("page %d: has next page %v with %d remaining of page size %d", pages, page.HasNextPage, remaining, first)
		}
		if !page.HasNextPage {
			break
		}
		req.After = ptr(instance.Cursor(page.Instances[len(page.Instances)-1]))
	}
	if want := (wantTotal + first - 1) / first; pages != max(want, 1) {
		t.Errorf("%d pages, want %d", pages, want)
	}
	return ids
}

func TestListPaging(t *testing.T) {
	e := newEnv(t)
	e.unlimited(t, "acme")
	const n = 250
	var all, odd []string
	for i := range n {
		r := validCreate()
		r.Name = fmt.Sprintf("i-%03d", i)
		r.Tags = []instance.Tag{{Name: "parity", Value: []string{"even", "odd"}[i%2]}}
		inst := e.create(t, acmeMember, r)
		all = append(all, inst.ID)
		if i%2 == 1 {
			odd = append(odd, inst.ID)
		}
	}
	orgWide := as("v", "acme", "", auth.RoleViewer)
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		filter *instance.Filter
		first  []int
		want   []string
	}{
		{"org-wide viewer", orgWide, nil, []int{100, 7, 1}, all},
		{"org-wide viewer, project", orgWide, &instance.Filter{ProjectID: ptr("web")}, []int{100, 7}, all},
		{"project viewer listing the org", acmeViewer, nil, []int{100, 7}, all},
		{"filter matching every instance", orgWide, &instance.Filter{NameContains: ptr("I-")}, []int{100, 7}, all},
		{"filter matching every other instance", orgWide, &instance.Filter{Tags: []instance.Tag{{Name: "parity", Value: "odd"}}}, []int{100, 7}, odd},
	} {
		for _, first := range tc.first {
			// A filtered total rescans the listing on every page: ask for it on the big pages.
			totals := []bool{false, true}
			if tc.filter != nil || tc.ctx != orgWide {
				totals = []bool{first == 100}
			}
			for _, total := range totals {
				t.Run(fmt.Sprintf("%s/first %d/total %v", tc.name, first, total), func(t *testing.T) {
					got := pageAll(t, e, tc.ctx, instance.ListRequest{OrganizationID: "acme", Filter: tc.filter, WantTotal: total}, first, len(tc.want))
					if !slices.Equal(got, tc.want) {
						t.Errorf("listed %d ids, not each of the %d once in creation order", len(got), len(tc.want))
					}
				})
			}
		}
	}

	t.Run("default page size", func(t *testing.T) {
		page, err := e.svc.List(orgWide, instance.ListRequest{OrganizationID: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Instances) != instance.DefaultPageSize || !page.HasNextPage || page.TotalCount != 0 {
			t.Errorf("%d instances, next %v, total %d", len(page.Instances), page.HasNextPage, page.TotalCount)
		}
	})
	t.Run("last page exactly full", func(t *testing.T) {
		page, err := e.svc.List(orgWide, instance.ListRequest{OrganizationID: "acme", First: ptr(50), After: ptr(instance.Cursor(&instance.Instance{ID: all[199]}))})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Instances) != 50 || page.HasNextPage || page.Instances[49].ID != all[249] {
			t.Errorf("%d instances, next %v", len(page.Instances), page.HasNextPage)
		}
	})
	t.Run("after the last", func(t *testing.T) {
		page, err := e.svc.List(orgWide, instance.ListRequest{OrganizationID: "acme", After: ptr(instance.Cursor(&instance.Instance{ID: all[n-1]})), WantTotal: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Instances) != 0 || page.HasNextPage || page.TotalCount != n {
			t.Errorf("%d instances, next %v, total %d", len(page.Instances), page.HasNextPage, page.TotalCount)
		}
	})
}

func TestListFilters(t *testing.T) {
	e := newEnv(t)
	dataMember := as("d", "acme", "data", auth.RoleMember)
	mk := func(ctx context.Context, project, network, name string, tags ...instance.Tag) *instance.Instance {
		r := validCreate()
		r.ProjectID, r.NetworkID, r.Name, r.Tags = project, network, name, tags
		if project == "prod" {
			r.OrganizationID = "globex"
		}
		return e.create(t, ctx, r)
	}
	tag := func(n, v string) instance.Tag { return instance.Tag{Name: n, Value: v} }
	web1 := mk(acmeMember, "web", "net-acme-web-eu", "web-1", tag("env", "prod"), tag("team", "a"))
	web2 := mk(acmeMember, "web", "net-acme-web-eu", "web-2", tag("env", "dev"))
	api := mk(acmeMember, "web", "net-acme-web-us", "API-Server", tag("env", "prod"))
	db := mk(dataMember, "data", "net-acme-data-eu", "db-1", tag("team", "a"), tag("env", "prod"))
	mk(globexMember, "prod", "net-globex-prod-eu", "web-1", tag("env", "prod")) // never listed for acme
	if _, err := e.svc.Delete(acmeMember, web2.ID, nil); err != nil {
		t.Fatal(err)
	}
	orgWide := as("v", "acme", "", auth.RoleViewer)
	names := func(insts ...*instance.Instance) []string {
		out := []string{}
		for _, i := range insts {
			out = append(out, i.Name)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		filter instance.Filter
		want   []string
	}{
		{"none", orgWide, instance.Filter{}, names(web1, web2, api, db)},
		{"project web", orgWide, instance.Filter{ProjectID: ptr("web")}, names(web1, web2, api)},
		{"project data", orgWide, instance.Filter{ProjectID: ptr("data")}, names(db)},
		{"region us-east", orgWide, instance.Filter{Region: ptr("us-east")}, names(api)},
		{"region eu-west", orgWide, instance.Filter{Region: ptr("eu-west")}, names(web1, web2, db)},
		{"unknown region", orgWide, instance.Filter{Region: ptr("mars")}, names()},
		{"network", orgWide, instance.Filter{NetworkID: ptr("net-acme-web-eu")}, names(web1, web2)},
		{"name", orgWide, instance.Filter{Name: ptr("web-1")}, names(web1)},
		{"name is exact", orgWide, instance.Filter{Name: ptr("WEB-1")}, names()},
		{"name contains, any case", orgWide, instance.Filter{NameContains: ptr("SeRvEr")}, names(api)},
		{"name contains", orgWide, instance.Filter{NameContains: ptr("web")}, names(web1, web2)},
		{"name contains nothing special", orgWide, instance.Filter{NameContains: ptr("-")}, names(web1, web2, api, db)},
		{"one tag", orgWide, instance.Filter{Tags: []instance.Tag{tag("env", "prod")}}, names(web1, api, db)},
		{"all tags must match", orgWide, instance.Filter{Tags: []instance.Tag{tag("env", "prod"), tag("team", "a")}}, names(web1, db)},
		{"tag value must match", orgWide, instance.Filter{Tags: []instance.Tag{tag("team", "b")}}, names()},
		{"tag name must match", orgWide, instance.Filter{Tags: []instance.Tag{tag("prod", "env")}}, names()},
		{"deprovisioning", orgWide, instance.Filter{ProvisioningStatus: []instance.ProvisioningStatus{instance.ProvisioningDeprovisioning}}, names(web2)},
		{"pending", orgWide, instance.Filter{ProvisioningStatus: []instance.ProvisioningStatus{instance.ProvisioningPending}}, names(web1, api, db)},
		{"pending or deprovisioning", orgWide, instance.Filter{ProvisioningStatus: []instance.ProvisioningStatus{instance.ProvisioningPending, instance.ProvisioningDeprovisioning}}, names(web1, web2, api, db)},
		{"power pending", orgWide, instance.Filter{PowerState: []instance.PowerState{instance.PowerPending}}, names(web1, web2, api, db)},
		{"power running", orgWide, instance.Filter{PowerState: []instance.PowerState{instance.PowerRunning, instance.PowerStopped}}, names()},
		{"several filters", orgWide, instance.Filter{ProjectID: ptr("web"), Tags: []instance.Tag{tag("env", "prod")}, Region: ptr("eu-west")}, names(web1)},
		{"project member sees its project only", acmeMember, instance.Filter{}, names(web1, web2, api)},
		{"project member, filtered", acmeMember, instance.Filter{Tags: []instance.Tag{tag("env", "prod")}}, names(web1, api)},
		{"project member, own project", acmeMember, instance.Filter{ProjectID: ptr("web")}, names(web1, web2, api)},
		{"data viewer sees data only", as("v", "acme", "data", auth.RoleViewer), instance.Filter{}, names(db)},
		{"grants on both projects", asGrants("x",
			auth.Grant{OrganizationID: "acme", ProjectID: "data", Role: auth.RoleViewer},
			auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleViewer}), instance.Filter{}, names(web1, web2, api, db)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.filter
			page, err := e.svc.List(tc.ctx, instance.ListRequest{OrganizationID: "acme", Filter: &f, WantTotal: true})
			if err != nil {
				t.Fatal(err)
			}
			got := names(page.Instances...)
			if !slices.Equal(got, tc.want) || page.TotalCount != len(tc.want) || page.HasNextPage {
				t.Errorf("listed %v (total %d, next %v), want %v", got, page.TotalCount, page.HasNextPage, tc.want)
			}
			for _, inst := range page.Instances {
				if inst.OrganizationID != "acme" {
					t.Errorf("listed %s of %s", inst.Name, inst.OrganizationID)
				}
			}
			// A page of one still says there are more.
			one, err := e.svc.List(tc.ctx, instance.ListRequest{OrganizationID: "acme", Filter: &f, First: ptr(1)})
			if err != nil {
				t.Fatal(err)
			}
			if one.HasNextPage != (len(tc.want) > 1) || len(one.Instances) != min(1, len(tc.want)) {
				t.Errorf("first 1: %d instances, next %v", len(one.Instances), one.HasNextPage)
			}
		})
	}
}

func TestListRefusals(t *testing.T) {
	e := newEnv(t)
	inst := e.create(t, acmeMember, validCreate())
	cursor := func(s string) *string { return ptr(base64.RawURLEncoding.EncodeToString([]byte(s))) }
	for _, tc := range []struct {
		name string
		ctx  context.Context
		req  instance.ListRequest
		want instance.Code
	}{
		{"first 0", acmeAdmin, instance.ListRequest{First: ptr(0)}, BadInput},
		{"first negative", acmeAdmin, instance.ListRequest{First: ptr(-1)}, BadInput},
		{"first 101", acmeAdmin, instance.ListRequest{First: ptr(instance.MaxPageSize + 1)}, BadInput},
		{"first 100", acmeAdmin, instance.ListRequest{First: ptr(instance.MaxPageSize)}, ""},
		{"empty cursor is the start", acmeAdmin, instance.ListRequest{After: ptr("")}, ""},
		{"cursor of a listed instance", acmeAdmin, instance.ListRequest{After: ptr(instance.Cursor(inst))}, ""},
		{"cursor not base64", acmeAdmin, instance.ListRequest{After: ptr("!!!")}, BadInput},
		{"cursor in the standard alphabet", acmeAdmin, instance.ListRequest{After: ptr(base64.StdEncoding.EncodeToString([]byte("i1:" + inst.ID + "??")))}, BadInput},
		{"cursor of another version", acmeAdmin, instance.ListRequest{After: cursor("i2:" + inst.ID)}, BadInput},
		{"cursor without a UUID", acmeAdmin, instance.ListRequest{After: cursor("i1:web-1")}, BadInput},
		{"cursor that is a bare id", acmeAdmin, instance.ListRequest{After: ptr(inst.ID)}, BadInput},
		{"another org", globexAdmin, instance.ListRequest{}, NotFound},
		{"unknown org", as("x", "nope", "", auth.RoleAdmin), instance.ListRequest{OrganizationID: "acme"}, NotFound},
		{"project the caller cannot read", acmeMember, instance.ListRequest{Filter: &instance.Filter{ProjectID: ptr("data")}}, NotFound},
		{"no principal", nobody, instance.ListRequest{}, instance.CodeUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			if req.OrganizationID == "" {
				req.OrganizationID = "acme"
			}
			page, err := e.svc.List(tc.ctx, req)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantCode(t, err, tc.want)
			if page != nil {
				t.Errorf("refused list returned %+v", page)
			}
		})
	}
}
