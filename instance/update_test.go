package instance_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/region"
)

// setTo is a change of a clearable field to v; unset clears it.
func setTo(v string) instance.Change { return instance.Change{Set: true, Value: &v} }

var unset = instance.Change{Set: true}

func TestUpdateNameIsImmutable(t *testing.T) {
	e := newEnv(t)
	inst := e.create(t, acmeMember, validCreate())
	_, err := e.svc.Update(acmeMember, instance.UpdateRequest{ID: inst.ID, Name: ptr("web-2")})
	wantProblems(t, err, p(Unprocessable, "name"))
	_, err = e.svc.Update(acmeMember, instance.UpdateRequest{ID: inst.ID, Name: ptr("WEB-1")})
	wantProblems(t, err, p(Unprocessable, "name"))
	if got := e.get(t, acmeMember, inst.ID); got.Name != "web-1" || got.Generation != 1 {
		t.Errorf("refused update changed the instance: %q generation %d", got.Name, got.Generation)
	}
	got := e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Name: ptr("web-1"), Description: ptr("same name")})
	if got.Name != "web-1" || got.Description != "same name" {
		t.Errorf("update with the same name: %+v", got.Spec)
	}
}

// rebuildBase is an instance with every destructive field set, so each can be changed or
// cleared.
func rebuildBase() instance.CreateRequest {
	r := validCreate()
	r.SSHCertificateAuthorityID = ptr("ca-acme-web")
	r.UserData = b64("#cloud-config\n")
	return r
}

func TestUpdateDestructiveChangesNeedAllowRebuild(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  instance.UpdateRequest
		want []problem // without allowRebuild; nil: no rebuild needed
	}{
		{"flavor", instance.UpdateRequest{FlavorID: ptr("g1.medium")}, []problem{p(Unprocessable, "flavorId")}},
		{"image", instance.UpdateRequest{ImageID: ptr("rocky-9")}, []problem{p(Unprocessable, "imageId")}},
		{"ssh ca cleared", instance.UpdateRequest{SSHCertificateAuthorityID: unset}, []problem{p(Unprocessable, "sshCertificateAuthorityId")}},
		{"ssh ca cleared with empty", instance.UpdateRequest{SSHCertificateAuthorityID: setTo("")}, []problem{p(Unprocessable, "sshCertificateAuthorityId")}},
		{"user data", instance.UpdateRequest{UserData: instance.Change{Set: true, Value: b64("#!/bin/sh\n")}}, []problem{p(Unprocessable, "userData")}},
		{"user data cleared", instance.UpdateRequest{UserData: unset}, []problem{p(Unprocessable, "userData")}},
		{"all four", instance.UpdateRequest{
			FlavorID: ptr("g1.medium"), ImageID: ptr("rocky-9"), SSHCertificateAuthorityID: unset,
			UserData: instance.Change{Set: true, Value: b64("#!/bin/sh\n")},
		}, []problem{p(Unprocessable, "flavorId"), p(Unprocessable, "imageId"), p(Unprocessable, "sshCertificateAuthorityId"), p(Unprocessable, "userData")}},
		{"unchanged values", instance.UpdateRequest{
			FlavorID: ptr("g1.small"), ImageID: ptr("ubuntu-24.04"), SSHCertificateAuthorityID: setTo("ca-acme-web"),
			UserData: instance.Change{Set: true, Value: b64("#cloud-config\n")},
		}, nil},
		{"fields not given", instance.UpdateRequest{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			inst := e.create(t, acmeMember, rebuildBase())
			req := tc.req
			req.ID = inst.ID
			if tc.want != nil {
				_, err := e.svc.Update(acmeMember, req)
				inv := wantProblems(t, err, tc.want...)
				for _, pr := range inv.Problems {
					if !strings.Contains(pr.Message, "allowRebuild") {
						t.Errorf("message %q does not say how to proceed", pr.Message)
					}
				}
				if got := e.get(t, acmeMember, inst.ID); got.Generation != 1 {
					t.Errorf("refused update wrote generation %d", got.Generation)
				}
			}
			req.AllowRebuild = true
			got := e.update(t, acmeMember, req)
			wantRebuild := int64(0)
			if tc.want != nil {
				wantRebuild = 2
			}
			if got.Generation != 2 || got.RebuildGeneration != wantRebuild {
				t.Errorf("generation %d rebuild generation %d, want 2 and %d", got.Generation, got.RebuildGeneration, wantRebuild)
			}
			stored := e.get(t, acmeMember, inst.ID)
			if stored.Generation != 2 || stored.RebuildGeneration != wantRebuild {
				t.Errorf("stored generation %d rebuild generation %d", stored.Generation, stored.RebuildGeneration)
			}
		})
	}
}

func TestUpdateRebuild(t *testing.T) {
	e := newEnv(t)
	inst := e.create(t, acmeMember, rebuildBase())
	e.now = e.now.Add(time.Hour)
	got := e.update(t, as("bob", "acme", "web", auth.RoleMember), instance.UpdateRequest{
		ID: inst.ID, FlavorID: ptr("g1.medium"), ImageID: ptr("rocky-9"), SSHCertificateAuthorityID: unset,
		UserData: instance.Change{Set: true, Value: b64("#!/bin/sh\necho hi\n")}, AllowRebuild: true,
	})
	for _, g := range []*instance.Instance{got, e.get(t, acmeMember, inst.ID)} {
		if g.Generation != 2 || g.RebuildGeneration != 2 || g.FlavorID != "g1.medium" || g.ImageID != "rocky-9" ||
			g.SSHCertificateAuthorityID != "" || string(g.UserData) != "#!/bin/sh\necho hi\n" {
			t.Errorf("after rebuild: generation %d %+v", g.Generation, g.Spec)
		}
		if !g.UpdatedAt.Equal(e.now) || g.UpdatedBy != "bob" || !g.CreatedAt.Equal(inst.CreatedAt) || g.CreatedBy != "alice" {
			t.Errorf("audit: created %v by %s, updated %v by %s", g.CreatedAt, g.CreatedBy, g.UpdatedAt, g.UpdatedBy)
		}
		if want := (quota.Amounts{quota.Servers: 1, quota.CPUs: 4, quota.MemoryGiB: 16}); fmt.Sprint(g.Charge) != fmt.Sprint(want) {
			t.Errorf("charge %v, want %v", g.Charge, want)
		}
	}
	e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 1, quota.CPUs: 4, quota.MemoryGiB: 16})
	if n := e.queued(t, inst); n != 2 {
		t.Errorf("queued %d times, want 2 (create and update)", n)
	}

	// A later change that needs no rebuild keeps the rebuild generation.
	got = e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Description: ptr("later")})
	if got.Generation != 3 || got.RebuildGeneration != 2 {
		t.Errorf("generation %d rebuild generation %d, want 3 and 2", got.Generation, got.RebuildGeneration)
	}
	// Setting a CA again is a rebuild at the new generation.
	got = e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, SSHCertificateAuthorityID: setTo("ca-acme-web"), AllowRebuild: true})
	if got.Generation != 4 || got.RebuildGeneration != 4 || got.SSHCertificateAuthorityID != "ca-acme-web" {
		t.Errorf("generation %d rebuild generation %d ca %q", got.Generation, got.RebuildGeneration, got.SSHCertificateAuthorityID)
	}
}

func TestUpdateInPlace(t *testing.T) {
	e := newEnv(t)
	req := validCreate()
	req.Tags = []instance.Tag{{Name: "env", Value: "dev"}}
	req.Networking = &instance.NetworkingRequest{SecurityGroupIDs: []string{"sg-acme-web-eu-ssh"}, AllowedSourceAddresses: []string{"10.0.0.0/8"}}
	inst := e.create(t, acmeMember, req)

	got := e.update(t, acmeMember, instance.UpdateRequest{
		ID: inst.ID, Description: ptr("now described"),
		Tags: []instance.Tag{{Name: "env", Value: "prod"}, {Name: "team", Value: "web"}}, TagsSet: true,
		Networking: &instance.NetworkingRequest{
			SecurityGroupIDs: []string{"sg-acme-web-eu-web", "sg-acme-web-eu-ssh"}, PublicIP: ptr(true),
			AllowedSourceAddresses: []string{"192.168.7.9/16", "2001:db8:1::5/48"},
		},
	})
	for _, g := range []*instance.Instance{got, e.get(t, acmeMember, inst.ID)} {
		if g.Generation != 2 || g.RebuildGeneration != 0 || g.Description != "now described" {
			t.Errorf("generation %d rebuild %d description %q", g.Generation, g.RebuildGeneration, g.Description)
		}
		if !slices.Equal(g.Tags, []instance.Tag{{Name: "env", Value: "prod"}, {Name: "team", Value: "web"}}) {
			t.Errorf("tags %v", g.Tags)
		}
		n := g.Networking
		if !slices.Equal(n.SecurityGroupIDs, []string{"sg-acme-web-eu-web", "sg-acme-web-eu-ssh"}) || !n.PublicIP ||
			!slices.Equal(n.AllowedSourceAddresses, []string{"192.168.0.0/16", "2001:db8:1::/48"}) {
			t.Errorf("networking %+v", n)
		}
	}

	// Networking fields left out stay; an empty list clears; tags can be cleared.
	got = e.update(t, acmeMember, instance.UpdateRequest{
		ID: inst.ID, Networking: &instance.NetworkingRequest{AllowedSourceAddresses: []string{}}, TagsSet: true,
	})
	n := got.Networking
	if got.Generation != 3 || got.RebuildGeneration != 0 || len(got.Tags) != 0 || len(n.AllowedSourceAddresses) != 0 ||
		!n.PublicIP || !slices.Equal(n.SecurityGroupIDs, []string{"sg-acme-web-eu-web", "sg-acme-web-eu-ssh"}) {
		t.Errorf("generation %d tags %v networking %+v", got.Generation, got.Tags, n)
	}
	// A description update leaves tags alone when they are not given.
	got = e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Tags: []instance.Tag{{Name: "ignored"}}})
	if len(got.Tags) != 0 {
		t.Errorf("tags without TagsSet were applied: %v", got.Tags)
	}
}

func TestUpdateValidation(t *testing.T) {
	gz := base64.StdEncoding.EncodeToString(gzipped(t, "#cloud-config\n"))
	for _, tc := range []struct {
		name   string
		create func(r *instance.CreateRequest) // changes validCreate for the instance
		req    instance.UpdateRequest
		want   []problem // nil: accepted
	}{
		{name: "description too long", req: instance.UpdateRequest{Description: ptr(string(make([]byte, instance.MaxDescription+1)))},
			want: []problem{p(BadInput, "description")}},
		{name: "reserved tag", req: instance.UpdateRequest{TagsSet: true, Tags: []instance.Tag{{Name: "a"}, {Name: "compute/instance-id", Value: "x"}}},
			want: []problem{p(BadInput, "tags", "1", "name")}},
		{name: "too many tags", req: instance.UpdateRequest{TagsSet: true, Tags: make([]instance.Tag, instance.MaxTags+1)},
			want: []problem{p(BadInput, "tags")}},
		{name: "unknown security group", req: instance.UpdateRequest{Networking: &instance.NetworkingRequest{SecurityGroupIDs: []string{"sg-acme-web-eu-ssh", "sg-nope"}}},
			want: []problem{p(NotFound, "networking", "securityGroupIds", "1")}},
		{name: "security group of another network", req: instance.UpdateRequest{Networking: &instance.NetworkingRequest{SecurityGroupIDs: []string{"sg-acme-web-us-web"}}},
			want: []problem{p(NotFound, "networking", "securityGroupIds", "0")}},
		{name: "security group of another org", req: instance.UpdateRequest{Networking: &instance.NetworkingRequest{SecurityGroupIDs: []string{"sg-globex-prod-eu-web"}}},
			want: []problem{p(NotFound, "networking", "securityGroupIds", "0")}},
		{name: "duplicate security group", req: instance.UpdateRequest{Networking: &instance.NetworkingRequest{SecurityGroupIDs: []string{"sg-acme-web-eu-web", "sg-acme-web-eu-web"}}},
			want: []problem{p(BadInput, "networking", "securityGroupIds", "1")}},
		{name: "bad CIDR", req: instance.UpdateRequest{Networking: &instance.NetworkingRequest{AllowedSourceAddresses: []string{"10.0.0.0/8", "10.0.0.0/40"}}},
			want: []problem{p(BadInput, "networking", "allowedSourceAddresses", "1")}},
		{name: "networking fields not given keep their stored values",
			create: func(r *instance.CreateRequest) {
				r.Networking = &instance.NetworkingRequest{SecurityGroupIDs: []string{"sg-acme-web-eu-ssh"}}
			},
			req: instance.UpdateRequest{Networking: &instance.NetworkingRequest{PublicIP: ptr(true)}}},
		{name: "unknown flavor", req: instance.UpdateRequest{FlavorID: ptr("nope"), AllowRebuild: true},
			want: []problem{p(NotFound, "flavorId")}},
		{name: "flavor not offered in the instance's region",
			create: func(r *instance.CreateRequest) { r.NetworkID = "net-acme-web-us" },
			req:    instance.UpdateRequest{FlavorID: ptr("gpu.a100x2"), AllowRebuild: true},
			want:   []problem{p(Unprocessable, "flavorId")}},
		{name: "unknown image", req: instance.UpdateRequest{ImageID: ptr("nope"), AllowRebuild: true},
			want: []problem{p(NotFound, "imageId")}},
		{name: "image not ready", req: instance.UpdateRequest{ImageID: ptr("fedora-41"), AllowRebuild: true},
			want: []problem{p(Unprocessable, "imageId")}},
		{name: "new flavor of another architecture", req: instance.UpdateRequest{FlavorID: ptr("a1.medium"), AllowRebuild: true},
			want: []problem{p(Unprocessable, "imageId")}},
		{name: "new flavor and image of the other architecture",
			req: instance.UpdateRequest{FlavorID: ptr("a1.medium"), ImageID: ptr("ubuntu-24.04-arm"), AllowRebuild: true}},
		{name: "new flavor too small for the image",
			create: func(r *instance.CreateRequest) { r.FlavorID, r.ImageID = "g1.medium", "windows-2022" },
			req:    instance.UpdateRequest{FlavorID: ptr("g1.small"), AllowRebuild: true},
			want:   []problem{p(Unprocessable, "imageId")}},
		{name: "baremetal image on the current virtualized flavor", req: instance.UpdateRequest{ImageID: ptr("debian-12-metal"), AllowRebuild: true},
			want: []problem{p(Unprocessable, "imageId"), p(Unprocessable, "imageId")}},
		{name: "ssh ca of another project", req: instance.UpdateRequest{SSHCertificateAuthorityID: setTo("ca-acme-data"), AllowRebuild: true},
			want: []problem{p(NotFound, "sshCertificateAuthorityId")}},
		{name: "ssh ca of another org", req: instance.UpdateRequest{SSHCertificateAuthorityID: setTo("ca-globex-prod"), AllowRebuild: true},
			want: []problem{p(NotFound, "sshCertificateAuthorityId")}},
		{name: "ssh ca of the project", req: instance.UpdateRequest{SSHCertificateAuthorityID: setTo("ca-acme-web"), AllowRebuild: true}},
		{name: "plain-text user data", req: instance.UpdateRequest{UserData: instance.Change{Set: true, Value: b64("hello")}, AllowRebuild: true},
			want: []problem{p(BadInput, "userData")}},
		{name: "invalid base64 user data", req: instance.UpdateRequest{UserData: setTo("%%%"), AllowRebuild: true},
			want: []problem{p(BadInput, "userData")}},
		{name: "gzip user data with the instance's CA",
			create: func(r *instance.CreateRequest) { r.SSHCertificateAuthorityID = ptr("ca-acme-web") },
			req:    instance.UpdateRequest{UserData: setTo(gz), AllowRebuild: true},
			want:   []problem{p(Unprocessable, "userData")}},
		{name: "gzip user data while clearing the CA",
			create: func(r *instance.CreateRequest) { r.SSHCertificateAuthorityID = ptr("ca-acme-web") },
			req:    instance.UpdateRequest{UserData: setTo(gz), SSHCertificateAuthorityID: unset, AllowRebuild: true}},
		{name: "a CA added to gzip user data",
			create: func(r *instance.CreateRequest) { r.UserData = &gz },
			req:    instance.UpdateRequest{SSHCertificateAuthorityID: setTo("ca-acme-web"), AllowRebuild: true},
			want:   []problem{p(Unprocessable, "userData")}},
		{name: "a CA added to gzip user data, without allowRebuild",
			create: func(r *instance.CreateRequest) { r.UserData = &gz },
			req:    instance.UpdateRequest{SSHCertificateAuthorityID: setTo("ca-acme-web")},
			want:   []problem{p(Unprocessable, "userData"), p(Unprocessable, "sshCertificateAuthorityId")}},
		{name: "a CA added while replacing gzip user data",
			create: func(r *instance.CreateRequest) { r.UserData = &gz },
			req:    instance.UpdateRequest{SSHCertificateAuthorityID: setTo("ca-acme-web"), UserData: instance.Change{Set: true, Value: b64("#cloud-config\n")}, AllowRebuild: true}},
		{name: "several at once",
			req: instance.UpdateRequest{
				Name: ptr("other"), Description: ptr(string(make([]byte, instance.MaxDescription+1))),
				ExpectedGeneration: ptr(int64(7)), FlavorID: ptr("g1.medium"),
				Networking: &instance.NetworkingRequest{AllowedSourceAddresses: []string{"x"}},
			},
			want: []problem{
				p(Conflict, "expectedGeneration"), p(Unprocessable, "name"), p(BadInput, "description"),
				p(BadInput, "networking", "allowedSourceAddresses", "0"), p(Unprocessable, "flavorId"),
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			cr := validCreate()
			if tc.create != nil {
				tc.create(&cr)
			}
			inst := e.create(t, acmeMember, cr)
			req := tc.req
			req.ID = inst.ID
			got, err := e.svc.Update(acmeMember, req)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if got.Generation != 2 {
					t.Errorf("generation %d", got.Generation)
				}
				return
			}
			wantProblems(t, err, tc.want...)
			if stored := e.get(t, acmeMember, inst.ID); stored.Generation != 1 || stored.Description != "" {
				t.Errorf("refused update was written: generation %d", stored.Generation)
			}
		})
	}
}

func TestUpdateExpectedGeneration(t *testing.T) {
	e := newEnv(t)
	inst := e.create(t, acmeMember, validCreate())
	for _, stale := range []int64{0, 2, 99} {
		_, err := e.svc.Update(acmeMember, instance.UpdateRequest{ID: inst.ID, Description: ptr("x"), ExpectedGeneration: ptr(stale)})
		wantProblems(t, err, p(Conflict, "expectedGeneration"))
	}
	got := e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Description: ptr("x"), ExpectedGeneration: ptr(int64(1))})
	if got.Generation != 2 {
		t.Fatalf("generation %d", got.Generation)
	}
	_, err := e.svc.Update(acmeMember, instance.UpdateRequest{ID: inst.ID, Description: ptr("y"), ExpectedGeneration: ptr(int64(1))})
	wantProblems(t, err, p(Conflict, "expectedGeneration"))
	e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Description: ptr("y"), ExpectedGeneration: ptr(int64(2))})
}

// TestUpdateLosesToAConcurrentWrite: a write lands between the update's read and its own
// write; the store's compare-and-set refuses the stale one as CONFLICT, not INTERNAL, and
// nothing of it is written.
func TestUpdateLosesToAConcurrentWrite(t *testing.T) {
	e := newEnv(t)
	inst := e.create(t, acmeMember, validCreate())
	svc := e.interfered(t, func() {
		e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Description: ptr("first")})
	})
	_, err := svc.Update(acmeMember, instance.UpdateRequest{
		ID: inst.ID, Description: ptr("second"), Networking: &instance.NetworkingRequest{PublicIP: ptr(true)},
	})
	wantProblems(t, err, p(Conflict, "id"))
	got := e.get(t, acmeMember, inst.ID)
	if got.Generation != 2 || got.Description != "first" || got.Networking.PublicIP {
		t.Errorf("generation %d description %q public IP %v", got.Generation, got.Description, got.Networking.PublicIP)
	}
	// The refused write charged nothing.
	e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4})
}

// A caller who named the generation it read learns which of its inputs went stale, whether
// the check fails before the write or the write loses the race.
func TestUpdateWithExpectedGenerationLosesToAConcurrentWrite(t *testing.T) {
	e := newEnv(t)
	inst := e.create(t, acmeMember, validCreate())
	svc := e.interfered(t, func() {
		e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Description: ptr("first")})
	})
	_, err := svc.Update(acmeMember, instance.UpdateRequest{ID: inst.ID, Description: ptr("second"), ExpectedGeneration: ptr(int64(1))})
	wantProblems(t, err, p(Conflict, "expectedGeneration"))
	if got := e.get(t, acmeMember, inst.ID); got.Description != "first" {
		t.Errorf("description %q", got.Description)
	}
}

func TestUpdateDeletingInstance(t *testing.T) {
	e := newEnv(t)
	inst := e.create(t, acmeMember, validCreate())
	if _, err := e.svc.Delete(acmeMember, inst.ID, nil); err != nil {
		t.Fatal(err)
	}
	for _, req := range []instance.UpdateRequest{
		{Description: ptr("too late")},
		{},
		{FlavorID: ptr("g1.medium"), AllowRebuild: true},
	} {
		req.ID = inst.ID
		_, err := e.svc.Update(acmeMember, req)
		wantProblems(t, err, p(Unprocessable, "id"))
	}
	if got := e.get(t, acmeMember, inst.ID); got.Generation != 2 || got.Description != "" {
		t.Errorf("generation %d description %q", got.Generation, got.Description)
	}
}

func TestUpdateQuota(t *testing.T) {
	toGPU := func(id string) instance.UpdateRequest {
		return instance.UpdateRequest{ID: id, FlavorID: ptr("gpu.a100x2"), AllowRebuild: true}
	}
	t.Run("a GPU flavor is charged and refused over quota", func(t *testing.T) {
		e := newEnv(t)
		for _, name := range []string{"gpu-1", "gpu-2"} {
			r := validCreate()
			r.Name, r.FlavorID = name, "gpu.a100x2"
			e.create(t, acmeMember, r)
		}
		small := e.create(t, acmeMember, validCreate())
		before := quota.Amounts{quota.Servers: 3, quota.GPUs: 4, quota.CPUs: 34, quota.MemoryGiB: 260}
		e.wantUsed(t, "acme", before)

		_, err := e.svc.Update(acmeMember, toGPU(small.ID))
		inv := wantProblems(t, err, p(QuotaExceeded, "flavorId"))
		if msg := inv.Problems[0].Message; msg != "quota exceeded for gpus: 6 requested in total, limit 4" {
			t.Errorf("message %q", msg)
		}
		// Refused along with other problems, the quota problem is still reported.
		req := toGPU(small.ID)
		req.AllowRebuild = false
		_, err = e.svc.Update(acmeMember, req)
		wantProblems(t, err, p(Unprocessable, "flavorId"), p(QuotaExceeded, "flavorId"))
		e.wantUsed(t, "acme", before)
		if got := e.get(t, acmeMember, small.ID); got.FlavorID != "g1.small" || got.Generation != 1 {
			t.Errorf("refused update written: %s generation %d", got.FlavorID, got.Generation)
		}
	})
	t.Run("switching to and from a GPU flavor", func(t *testing.T) {
		e := newEnv(t)
		inst := e.create(t, acmeMember, validCreate())
		got := e.update(t, acmeMember, toGPU(inst.ID))
		gpuCharge := quota.Amounts{quota.Servers: 1, quota.GPUs: 2, quota.CPUs: 16, quota.MemoryGiB: 128}
		if fmt.Sprint(got.Charge) != fmt.Sprint(gpuCharge) {
			t.Errorf("charge %v, want %v", got.Charge, gpuCharge)
		}
		e.wantUsed(t, "acme", gpuCharge)
		e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, FlavorID: ptr("g1.small"), AllowRebuild: true})
		e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4})
	})
	t.Run("public IP is charged and released", func(t *testing.T) {
		e := newEnv(t)
		inst := e.create(t, acmeMember, validCreate())
		got := e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Networking: &instance.NetworkingRequest{PublicIP: ptr(true)}})
		if got.Charge[quota.PublicIPs] != 1 || got.RebuildGeneration != 0 {
			t.Errorf("charge %v rebuild generation %d", got.Charge, got.RebuildGeneration)
		}
		e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4, quota.PublicIPs: 1})
		// Unchanged: charged once only.
		e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Networking: &instance.NetworkingRequest{PublicIP: ptr(true)}})
		e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4, quota.PublicIPs: 1})
		// A rebuild to another flavor keeps the public IP charge.
		e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, FlavorID: ptr("g1.medium"), AllowRebuild: true})
		e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 1, quota.CPUs: 4, quota.MemoryGiB: 16, quota.PublicIPs: 1})
		got = e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Networking: &instance.NetworkingRequest{PublicIP: ptr(false)}})
		if _, has := got.Charge[quota.PublicIPs]; has {
			t.Errorf("charge %v still holds a public IP", got.Charge)
		}
		e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 1, quota.CPUs: 4, quota.MemoryGiB: 16})
	})
	t.Run("public IP over quota", func(t *testing.T) {
		e := newEnv(t)
		for i := range 4 { // globex allows 4
			r := globexCreate()
			r.Name = fmt.Sprintf("pub-%d", i)
			r.Networking = &instance.NetworkingRequest{PublicIP: ptr(true)}
			e.create(t, globexMember, r)
		}
		inst := e.create(t, globexMember, globexCreate())
		_, err := e.svc.Update(globexMember, instance.UpdateRequest{ID: inst.ID, Networking: &instance.NetworkingRequest{PublicIP: ptr(true)}})
		inv := wantProblems(t, err, p(QuotaExceeded, "networking", "publicIP"))
		if msg := inv.Problems[0].Message; msg != "quota exceeded for publicIPs: 5 requested in total, limit 4" {
			t.Errorf("message %q", msg)
		}
	})
	t.Run("shrinking is allowed over a lowered limit", func(t *testing.T) {
		e := newEnv(t)
		r := validCreate()
		r.FlavorID = "g1.medium"
		inst := e.create(t, acmeMember, r)
		e.setLimits(t, "acme", map[quota.Kind]int64{quota.CPUs: 1, quota.MemoryGiB: 1})
		e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, FlavorID: ptr("g1.small"), AllowRebuild: true})
		e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4})
		// Unrelated updates of an instance over a lowered limit are not refused either.
		e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Description: ptr("still fine")})
		// Growing again is.
		_, err := e.svc.Update(acmeMember, instance.UpdateRequest{ID: inst.ID, FlavorID: ptr("g1.medium"), AllowRebuild: true})
		wantProblems(t, err, p(QuotaExceeded, "flavorId"), p(QuotaExceeded, "flavorId"))
	})
}

// retiringCatalog adds a flavor and an image that a later catalogue retires.
func retiringCatalog(t *testing.T) *region.Catalog {
	return customCatalog(t, func(c *region.Catalog) {
		c.Flavors = append(c.Flavors, region.Flavor{
			ID: "old.small", Name: "Old small", CPUs: 1, MemoryGiB: 2, DiskGB: 20,
			Architecture: region.ArchitectureX86_64, Regions: []string{"eu-west", "us-east"},
		})
		c.Images = append(c.Images, region.Image{
			ID: "old-image", Name: "Old image", Architecture: region.ArchitectureX86_64, SizeGiB: 8,
			Virtualization: region.VirtualizationAny, State: region.ImageStateReady, Regions: []string{"eu-west", "us-east"},
		})
	})
}

func TestUpdateRetiredFlavorAndImage(t *testing.T) {
	e := newEnvWith(t, retiringCatalog(t))
	oldFlavor := validCreate()
	oldFlavor.Name, oldFlavor.FlavorID = "old-flavor", "old.small"
	a := e.create(t, acmeMember, oldFlavor)
	oldImage := validCreate()
	oldImage.Name, oldImage.ImageID = "old-image", "old-image"
	b := e.create(t, acmeMember, oldImage)

	// The region retires both: a service over the same Redis now validates against a
	// catalogue without them.
	retired := editCatalog(t, e.svc.Catalog(), func(c *region.Catalog) {
		c.Flavors = without(c.Flavors, func(f *region.Flavor) string { return f.ID }, "old.small")
		c.Images = without(c.Images, func(i *region.Image) string { return i.ID }, "old-image")
	})
	if _, ok := e.svc.Catalog().Flavor("old.small"); !ok {
		t.Fatal("old.small is not in the first catalogue")
	}
	if _, ok := retired.Flavor("old.small"); ok {
		t.Fatal("old.small is still in the later catalogue")
	}
	if _, ok := retired.Image("old-image"); ok {
		t.Fatal("old-image is still in the later catalogue")
	}
	later := e.withCatalog(t, retired)

	// The instances are still there.
	later.get(t, acmeMember, a.ID)
	later.get(t, acmeMember, b.ID)

	// Unrelated updates go through.
	got := later.update(t, acmeMember, instance.UpdateRequest{ID: a.ID, Description: ptr("still here"), TagsSet: true, Tags: []instance.Tag{{Name: "k"}}})
	if got.FlavorID != "old.small" || got.Generation != 2 {
		t.Errorf("flavor %q generation %d", got.FlavorID, got.Generation)
	}
	later.update(t, acmeMember, instance.UpdateRequest{ID: a.ID, Networking: &instance.NetworkingRequest{PublicIP: ptr(true), SecurityGroupIDs: []string{"sg-acme-web-eu-ssh"}}})
	later.update(t, acmeMember, instance.UpdateRequest{ID: b.ID, Description: ptr("still here")})
	later.update(t, acmeMember, instance.UpdateRequest{ID: a.ID, FlavorID: ptr("old.small"), ImageID: ptr("ubuntu-24.04")})
	later.wantUsed(t, "acme", quota.Amounts{quota.Servers: 2, quota.CPUs: 3, quota.MemoryGiB: 6, quota.PublicIPs: 1})

	// A rebuild needs the flavor and the image the new server boots.
	_, err := later.svc.Update(acmeMember, instance.UpdateRequest{ID: a.ID, ImageID: ptr("rocky-9"), AllowRebuild: true})
	wantProblems(t, err, p(NotFound, "flavorId"))
	_, err = later.svc.Update(acmeMember, instance.UpdateRequest{ID: a.ID, UserData: instance.Change{Set: true, Value: b64("#!/bin/sh\n")}, AllowRebuild: true})
	wantProblems(t, err, p(NotFound, "flavorId"))
	_, err = later.svc.Update(acmeMember, instance.UpdateRequest{ID: b.ID, FlavorID: ptr("g1.medium"), AllowRebuild: true})
	wantProblems(t, err, p(NotFound, "imageId"))

	// Moving off the retired flavor or image works, and re-charges for the new flavor.
	got = later.update(t, acmeMember, instance.UpdateRequest{ID: a.ID, FlavorID: ptr("g1.small"), AllowRebuild: true})
	if want := (quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4, quota.PublicIPs: 1}); fmt.Sprint(got.Charge) != fmt.Sprint(want) {
		t.Errorf("charge %v, want %v", got.Charge, want)
	}
	later.update(t, acmeMember, instance.UpdateRequest{ID: b.ID, ImageID: ptr("ubuntu-24.04"), AllowRebuild: true})
	later.wantUsed(t, "acme", quota.Amounts{quota.Servers: 2, quota.CPUs: 4, quota.MemoryGiB: 8, quota.PublicIPs: 1})

	// An image that is no longer ready blocks a rebuild onto it as well.
	notReady := customCatalog(t, func(c *region.Catalog) {
		for i := range c.Images {
			if c.Images[i].ID == "ubuntu-24.04" {
				c.Images[i].State = region.ImageStateFailed
			}
		}
	})
	_, err = e.withCatalog(t, notReady).svc.Update(acmeMember, instance.UpdateRequest{ID: b.ID, FlavorID: ptr("g1.medium"), AllowRebuild: true})
	wantProblems(t, err, p(Unprocessable, "imageId"))
}

func TestUpdateAccess(t *testing.T) {
	e := newEnv(t)
	inst := e.create(t, acmeMember, validCreate())
	for _, tc := range []struct {
		name string
		ctx  context.Context
		id   string
		want instance.Code
	}{
		{"no principal", nobody, inst.ID, instance.CodeUnauthenticated},
		{"viewer", acmeViewer, inst.ID, instance.CodeForbidden},
		{"operator", acmeOperator, inst.ID, instance.CodeForbidden},
		{"org-wide operator", as("o", "acme", "", auth.RoleOperator), inst.ID, instance.CodeForbidden},
		{"member of another project", as("d", "acme", "data", auth.RoleMember), inst.ID, NotFound},
		{"admin of another org", globexAdmin, inst.ID, NotFound},
		{"unknown id", acmeMember, uuid.NewString(), NotFound},
		{"malformed id", acmeMember, "web-1", BadInput},
		{"empty id", acmeMember, "", BadInput},
		{"braced id", acmeMember, "{" + inst.ID + "}", BadInput},
		{"id without dashes", acmeMember, strings.ReplaceAll(inst.ID, "-", ""), BadInput},
		{"project member", acmeMember, inst.ID, ""},
		{"org-wide member", as("m", "acme", "", auth.RoleMember), inst.ID, ""},
		{"admin", acmeAdmin, inst.ID, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.get(t, acmeMember, inst.ID).Generation
			_, err := e.svc.Update(tc.ctx, instance.UpdateRequest{ID: tc.id, Description: ptr(tc.name)})
			after := e.get(t, acmeMember, inst.ID).Generation
			if tc.want == "" {
				if err != nil || after != before+1 {
					t.Fatalf("refused (%v) or not written (generation %d -> %d)", err, before, after)
				}
				return
			}
			wantCode(t, err, tc.want)
			if after != before {
				t.Errorf("refused update written")
			}
		})
	}
}

// TestUpdateOnARetiredNetwork: the instance's network left the catalogue (its instances are
// on their way out). Security groups must still be those of the instance's own network, which
// now means none: a group of another network, or of another organization, is not found.
func TestUpdateOnARetiredNetwork(t *testing.T) {
	e := newEnv(t)
	r := validCreate()
	r.Networking = &instance.NetworkingRequest{SecurityGroupIDs: []string{"sg-acme-web-eu-ssh"}}
	inst := e.create(t, acmeMember, r)
	later := e.withCatalog(t, customCatalog(t, func(c *region.Catalog) {
		c.Networks = without(c.Networks, func(n *region.Network) string { return n.ID }, "net-acme-web-eu")
		for _, sg := range []string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-web"} {
			c.SecurityGroups = without(c.SecurityGroups, func(s *region.SecurityGroup) string { return s.ID }, sg)
		}
	}))

	later.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Description: ptr("still readable")})
	for _, sgs := range [][]string{{"sg-acme-web-us-ssh"}, {"sg-globex-prod-eu-ssh"}, {"sg-acme-web-eu-ssh"}} {
		_, err := later.svc.Update(acmeMember, instance.UpdateRequest{ID: inst.ID, Networking: &instance.NetworkingRequest{SecurityGroupIDs: sgs}})
		wantProblems(t, err, p(NotFound, "networking", "securityGroupIds", "0"))
	}
	// The stored groups are gone too, so they are refused unless replaced.
	_, err := later.svc.Update(acmeMember, instance.UpdateRequest{ID: inst.ID, Networking: &instance.NetworkingRequest{PublicIP: ptr(true)}})
	wantProblems(t, err, p(NotFound, "networking", "securityGroupIds", "0"))
	got := later.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Networking: &instance.NetworkingRequest{SecurityGroupIDs: []string{}, PublicIP: ptr(true)}})
	if len(got.Networking.SecurityGroupIDs) != 0 || !got.Networking.PublicIP {
		t.Errorf("networking %+v", got.Networking)
	}
}
