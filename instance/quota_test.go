package instance_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/quota"
)

func TestQuotaCharge(t *testing.T) {
	e := newEnv(t)
	limits, _ := e.quota(t, "acme")
	if want := (quota.Amounts{quota.Servers: 50, quota.GPUs: 4, quota.PublicIPs: 10, quota.CPUs: 256, quota.MemoryGiB: 1024}); fmt.Sprint(limits) != fmt.Sprint(want) {
		t.Fatalf("acme limits %v, want the catalogue's %v", limits, want)
	}
	e.wantUsed(t, "acme", nil)

	req := validCreate()
	req.Networking = &instance.NetworkingRequest{PublicIP: ptr(true)}
	e.create(t, acmeMember, req)
	e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4, quota.PublicIPs: 1})

	gpu := validCreate()
	gpu.Name, gpu.FlavorID = "gpu-1", "gpu.a100x2"
	inst := e.create(t, acmeMember, gpu)
	if want := (quota.Amounts{quota.Servers: 1, quota.CPUs: 16, quota.MemoryGiB: 128, quota.GPUs: 2}); fmt.Sprint(inst.Charge) != fmt.Sprint(want) {
		t.Errorf("gpu instance charge %v, want %v", inst.Charge, want)
	}
	e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 2, quota.CPUs: 18, quota.MemoryGiB: 132, quota.GPUs: 2, quota.PublicIPs: 1})

	// Quota is per organization.
	e.wantUsed(t, "globex", nil)

	// The reported order of kinds is fixed.
	q, err := e.svc.Quota(acmeMember, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if q.OrganizationID != "acme" || len(q.Limits) != len(quota.Kinds) {
		t.Fatalf("quota %+v", q)
	}
	for i, k := range quota.Kinds {
		if q.Limits[i].Kind != k {
			t.Errorf("limit %d is %s, want %s", i, q.Limits[i].Kind, k)
		}
	}
}

func TestQuotaExceeded(t *testing.T) {
	gpu := func(name string) instance.CreateRequest {
		r := validCreate()
		r.Name, r.FlavorID = name, "gpu.a100x2"
		return r
	}
	t.Run("gpus in acme", func(t *testing.T) {
		e := newEnv(t)
		e.create(t, acmeMember, gpu("gpu-1"))
		e.create(t, acmeMember, gpu("gpu-2"))
		_, err := e.svc.Create(acmeMember, gpu("gpu-3"))
		inv := wantProblems(t, err, p(QuotaExceeded, "flavorId"))
		if msg := inv.Problems[0].Message; msg != "quota exceeded for gpus: 6 requested in total, limit 4" {
			t.Errorf("message %q does not name kind, requested total and limit", msg)
		}
		e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 2, quota.CPUs: 32, quota.MemoryGiB: 256, quota.GPUs: 4})
		// A flavor without GPUs still fits.
		e.create(t, acmeMember, validCreate())
	})
	t.Run("gpus in globex", func(t *testing.T) {
		e := newEnv(t)
		r := globexCreate()
		r.FlavorID = "gpu.a100x2"
		_, err := e.svc.Create(globexMember, r)
		inv := wantProblems(t, err, p(QuotaExceeded, "flavorId"))
		if msg := inv.Problems[0].Message; msg != "quota exceeded for gpus: 2 requested in total, limit 0" {
			t.Errorf("message %q", msg)
		}
		e.wantUsed(t, "globex", nil)
	})
	t.Run("public IPs", func(t *testing.T) {
		e := newEnv(t)
		for i := range 4 { // globex allows 4
			r := globexCreate()
			r.Name = fmt.Sprintf("pub-%d", i)
			r.Networking = &instance.NetworkingRequest{PublicIP: ptr(true)}
			e.create(t, globexMember, r)
		}
		r := globexCreate()
		r.Name = "pub-4"
		r.Networking = &instance.NetworkingRequest{PublicIP: ptr(true)}
		_, err := e.svc.Create(globexMember, r)
		inv := wantProblems(t, err, p(QuotaExceeded, "networking", "publicIP"))
		if msg := inv.Problems[0].Message; msg != "quota exceeded for publicIPs: 5 requested in total, limit 4" {
			t.Errorf("message %q", msg)
		}
		// Without a public IP it fits.
		r.Networking.PublicIP = ptr(false)
		e.create(t, globexMember, r)
		e.wantUsed(t, "globex", quota.Amounts{quota.Servers: 5, quota.CPUs: 10, quota.MemoryGiB: 20, quota.PublicIPs: 4})
	})
	t.Run("servers cpus and memory", func(t *testing.T) {
		e := newEnv(t)
		e.setLimits(t, "acme", map[quota.Kind]int64{quota.Servers: 1, quota.CPUs: 5, quota.MemoryGiB: 7})
		e.create(t, acmeMember, validCreate()) // 1 server, 2 cpus, 4 GiB
		r := validCreate()
		r.Name, r.FlavorID = "web-2", "g1.medium" // 4 cpus, 16 GiB
		r.Networking = &instance.NetworkingRequest{PublicIP: ptr(true)}
		_, err := e.svc.Create(acmeMember, r)
		inv := wantProblems(t, err, p(QuotaExceeded, "flavorId"), p(QuotaExceeded, "flavorId"), p(QuotaExceeded, "flavorId"))
		for i, want := range []string{
			"quota exceeded for servers: 2 requested in total, limit 1",
			"quota exceeded for cpus: 6 requested in total, limit 5",
			"quota exceeded for memoryGiB: 20 requested in total, limit 7",
		} {
			if got := inv.Problems[i].Message; got != want {
				t.Errorf("problem %d: %q, want %q", i, got, want)
			}
		}
		e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4})
	})
	t.Run("exactly at the limit", func(t *testing.T) {
		e := newEnv(t)
		e.setLimits(t, "acme", map[quota.Kind]int64{quota.Servers: 2, quota.CPUs: 4, quota.MemoryGiB: 8, quota.PublicIPs: 1})
		r := validCreate()
		r.Networking = &instance.NetworkingRequest{PublicIP: ptr(true)}
		e.create(t, acmeMember, r)
		// Refused for its name only: the precheck that lists quota with other problems does
		// not count reaching every limit exactly as a quota problem.
		_, err := e.svc.Create(acmeMember, instance.CreateRequest{
			OrganizationID: "acme", ProjectID: "web", NetworkID: "net-acme-web-eu",
			Name: "-", FlavorID: "g1.small", ImageID: "ubuntu-24.04",
		})
		wantProblems(t, err, p(BadInput, "name"))
		r.Name, r.Networking = "web-2", nil
		e.create(t, acmeMember, r)
		e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 2, quota.CPUs: 4, quota.MemoryGiB: 8, quota.PublicIPs: 1})
		// One more is over every limit, in the precheck and in the store alike.
		_, err = e.svc.Create(acmeMember, instance.CreateRequest{
			OrganizationID: "acme", ProjectID: "web", NetworkID: "net-acme-web-eu",
			Name: "-", FlavorID: "g1.small", ImageID: "ubuntu-24.04",
		})
		wantProblems(t, err, p(BadInput, "name"), p(QuotaExceeded, "flavorId"), p(QuotaExceeded, "flavorId"), p(QuotaExceeded, "flavorId"))
		r.Name = "web-3"
		r.Networking = &instance.NetworkingRequest{PublicIP: ptr(true)}
		_, err = e.svc.Create(acmeMember, r)
		wantProblems(t, err, p(QuotaExceeded, "flavorId"), p(QuotaExceeded, "networking", "publicIP"),
			p(QuotaExceeded, "flavorId"), p(QuotaExceeded, "flavorId"))
	})
	t.Run("a name conflict and quota at once", func(t *testing.T) {
		e := newEnv(t)
		e.create(t, acmeMember, validCreate())
		e.setLimits(t, "acme", map[quota.Kind]int64{quota.Servers: 1})
		_, err := e.svc.Create(acmeMember, validCreate())
		wantProblems(t, err, p(Conflict, "name"), p(QuotaExceeded, "flavorId"))
	})
}

func TestSetQuota(t *testing.T) {
	t.Run("access", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			ctx  context.Context
			org  string
			want instance.Code
		}{
			{"no principal", nobody, "acme", instance.CodeUnauthenticated},
			{"project member", acmeMember, "acme", instance.CodeForbidden},
			{"org-wide member", as("m", "acme", "", auth.RoleMember), "acme", instance.CodeForbidden},
			{"org-wide viewer", as("v", "acme", "", auth.RoleViewer), "acme", instance.CodeForbidden},
			{"admin of another org", globexAdmin, "acme", NotFound},
			{"admin of an org the catalogue does not know", as("x", "nope", "", auth.RoleAdmin), "nope", NotFound},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e := newEnv(t)
				_, err := e.svc.SetQuota(tc.ctx, tc.org, []instance.LimitRequest{{Kind: "servers", Limit: 1}}, nil)
				wantCode(t, err, tc.want)
				if limits, _ := e.quota(t, "acme"); limits[quota.Servers] != 50 {
					t.Errorf("servers limit changed to %d", limits[quota.Servers])
				}
			})
		}
	})

	t.Run("validation", func(t *testing.T) {
		lim := func(kind string, limit int64) instance.LimitRequest {
			return instance.LimitRequest{Kind: kind, Limit: limit}
		}
		at := func(i, part string) problem { return p(BadInput, "limits", i, part) }
		for _, tc := range []struct {
			name string
			reqs []instance.LimitRequest
			want []problem
		}{
			{"empty list", nil, []problem{p(BadInput, "limits")}},
			{"unknown kind", []instance.LimitRequest{lim("servers", 1), lim("disks", 1)}, []problem{at("1", "kind")}},
			{"kind is case-sensitive", []instance.LimitRequest{lim("Servers", 1)}, []problem{at("0", "kind")}},
			{"negative", []instance.LimitRequest{lim("gpus", -1)}, []problem{at("0", "limit")}},
			{"over the maximum", []instance.LimitRequest{lim("gpus", instance.MaxQuotaLimit+1)}, []problem{at("0", "limit")}},
			{"duplicate", []instance.LimitRequest{lim("gpus", 1), lim("cpus", 1), lim("gpus", 2)}, []problem{at("2", "kind")}},
			{"unknown kind with a negative limit", []instance.LimitRequest{lim("nope", -5)}, []problem{at("0", "kind"), at("0", "limit")}},
			{"several", []instance.LimitRequest{lim("servers", -1), lim("nope", 1), lim("servers", 1)},
				[]problem{at("0", "limit"), at("1", "kind"), at("2", "kind")}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e := newEnv(t)
				_, err := e.svc.SetQuota(acmeAdmin, "acme", tc.reqs, nil)
				wantProblems(t, err, tc.want...)
				limits, _ := e.quota(t, "acme")
				if limits[quota.Servers] != 50 || limits[quota.GPUs] != 4 || limits[quota.CPUs] != 256 {
					t.Errorf("a refused request changed limits: %v", limits)
				}
			})
		}
	})

	t.Run("accepted", func(t *testing.T) {
		e := newEnv(t)
		e.create(t, acmeMember, validCreate())
		q, err := e.svc.SetQuota(acmeAdmin, "acme", []instance.LimitRequest{
			{Kind: "gpus", Limit: 0}, {Kind: "cpus", Limit: instance.MaxQuotaLimit},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := []instance.QuotaLimit{
			{Kind: quota.Servers, Limit: 50, Used: 1},
			{Kind: quota.GPUs, Limit: 0, Used: 0},
			{Kind: quota.PublicIPs, Limit: 10, Used: 0},
			{Kind: quota.CPUs, Limit: instance.MaxQuotaLimit, Used: 2},
			{Kind: quota.MemoryGiB, Limit: 1024, Used: 4},
		}
		if q.OrganizationID != "acme" || fmt.Sprint(q.Limits) != fmt.Sprint(want) {
			t.Errorf("set quota returned %+v, want %+v", q.Limits, want)
		}
		// Other limits and other organizations are untouched; the change lasts.
		if limits, _ := e.quota(t, "acme"); limits[quota.GPUs] != 0 || limits[quota.Servers] != 50 {
			t.Errorf("acme limits %v", limits)
		}
		if limits, _ := e.quota(t, "globex"); limits[quota.CPUs] != 64 {
			t.Errorf("globex limits %v", limits)
		}
		r := validCreate()
		r.Name, r.FlavorID = "gpu", "gpu.a100x2"
		_, err = e.svc.Create(acmeMember, r)
		wantProblems(t, err, p(QuotaExceeded, "flavorId"))
	})

	t.Run("a limit below usage is accepted and blocks new creates", func(t *testing.T) {
		e := newEnv(t)
		for i := range 3 {
			r := validCreate()
			r.Name = fmt.Sprintf("web-%d", i)
			e.create(t, acmeMember, r)
		}
		e.setLimits(t, "acme", map[quota.Kind]int64{quota.Servers: 2})
		limits, used := e.quota(t, "acme")
		if limits[quota.Servers] != 2 || used[quota.Servers] != 3 {
			t.Errorf("servers limit %d used %d, want 2 and 3", limits[quota.Servers], used[quota.Servers])
		}
		r := validCreate()
		r.Name = "web-3"
		_, err := e.svc.Create(acmeMember, r)
		inv := wantProblems(t, err, p(QuotaExceeded, "flavorId"))
		if msg := inv.Problems[0].Message; msg != "quota exceeded for servers: 4 requested in total, limit 2" {
			t.Errorf("message %q", msg)
		}
		if n := e.count(t, "acme"); n != 3 {
			t.Errorf("%d instances, want 3", n)
		}
	})
}

func TestQuotaVisibility(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		org  string
		want instance.Code
	}{
		{"project viewer of another project", as("v", "acme", "data", auth.RoleViewer), "acme", ""},
		{"project member", acmeMember, "acme", ""},
		{"org-wide viewer", as("v", "acme", "", auth.RoleViewer), "acme", ""},
		{"admin", acmeAdmin, "acme", ""},
		{"member of another org", globexMember, "acme", NotFound},
		{"admin of another org", globexAdmin, "acme", NotFound},
		{"unknown org", acmeAdmin, "nope", NotFound},
		{"org not in the catalogue, though granted", as("x", "initech", "", auth.RoleAdmin), "initech", NotFound},
		{"no principal", nobody, "acme", instance.CodeUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := e.svc.Quota(tc.ctx, tc.org)
			if tc.want != "" {
				wantCode(t, err, tc.want)
				return
			}
			if err != nil || q.OrganizationID != tc.org || len(q.Limits) != len(quota.Kinds) {
				t.Fatalf("quota %+v, %v", q, err)
			}
		})
	}
}
