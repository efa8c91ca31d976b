package instance_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/quota"
)

func TestDelete(t *testing.T) {
	e := newEnv(t)
	req := validCreate()
	req.Networking = &instance.NetworkingRequest{PublicIP: ptr(true)}
	inst := e.create(t, acmeMember, req)
	created := e.now
	e.now = e.now.Add(time.Hour)
	deletedAt := e.now

	got, err := e.svc.Delete(as("bob", "acme", "web", auth.RoleMember), inst.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	stored := e.get(t, acmeMember, inst.ID)
	for _, g := range []*instance.Instance{got, stored} {
		if g.ID != inst.ID || !g.Deleting() || g.DeletedAt == nil || !g.DeletedAt.Equal(deletedAt) {
			t.Errorf("deleted at %v, want %v", g.DeletedAt, deletedAt)
		}
		if g.Generation != 2 || g.StatusVersion != 2 {
			t.Errorf("generation %d status version %d, want 2 and 2", g.Generation, g.StatusVersion)
		}
		if g.Status.ProvisioningStatus != instance.ProvisioningDeprovisioning {
			t.Errorf("provisioning status %s", g.Status.ProvisioningStatus)
		}
		c := g.Status.Conditions
		// The condition stays False, so its transition time is the one of create.
		if len(c) != 1 || c[0].Type != instance.ConditionAvailable || c[0].Status != instance.ConditionFalse ||
			c[0].Reason != instance.ReasonDeprovisioning || c[0].Message == "" || !c[0].LastTransitionTime.Equal(created) {
			t.Errorf("conditions %+v", c)
		}
		if !g.UpdatedAt.Equal(deletedAt) || g.UpdatedBy != "bob" || g.Name != "web-1" {
			t.Errorf("spec %+v", g.Spec)
		}
	}
	if n := e.queued(t, inst); n != 2 {
		t.Errorf("queued %d times, want 2 (create and delete)", n)
	}
	// Quota is released by workers once the server is gone, not by Delete.
	e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4, quota.PublicIPs: 1})

	// Deleting again changes nothing and returns the instance as it is.
	e.now = e.now.Add(time.Hour)
	again, err := e.svc.Delete(acmeMember, inst.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != inst.ID || again.Generation != 2 || again.StatusVersion != 2 || !again.DeletedAt.Equal(deletedAt) ||
		again.UpdatedBy != "bob" || again.Status.ProvisioningStatus != instance.ProvisioningDeprovisioning {
		t.Errorf("second delete: generation %d deleted at %v by %s", again.Generation, again.DeletedAt, again.UpdatedBy)
	}
	if g := e.get(t, acmeMember, inst.ID); g.Generation != 2 || !g.DeletedAt.Equal(deletedAt) {
		t.Errorf("second delete wrote: generation %d deleted at %v", g.Generation, g.DeletedAt)
	}
	if n := e.queued(t, inst); n != 2 {
		t.Errorf("queued %d times after a no-op delete, want 2", n)
	}
	e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4, quota.PublicIPs: 1})
	if n := e.count(t, "acme"); n != 1 {
		t.Errorf("%d instances listed, want the deleting one", n)
	}
}

func TestDeleteAccess(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		id   func(inst *instance.Instance) string
		want instance.Code
	}{
		{"no principal", nobody, nil, instance.CodeUnauthenticated},
		{"viewer", acmeViewer, nil, instance.CodeForbidden},
		{"operator", acmeOperator, nil, instance.CodeForbidden},
		{"member of another project", as("d", "acme", "data", auth.RoleMember), nil, NotFound},
		{"member of another org", globexMember, nil, NotFound},
		{"admin of another org", globexAdmin, nil, NotFound},
		{"unknown id", acmeMember, func(*instance.Instance) string { return uuid.NewString() }, NotFound},
		{"malformed id", acmeMember, func(*instance.Instance) string { return "web-1" }, BadInput},
		{"project member", acmeMember, nil, ""},
		{"org-wide member", as("m", "acme", "", auth.RoleMember), nil, ""},
		{"admin", acmeAdmin, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := validCreate()
			r.Name = uuid.NewString()[:8]
			inst := e.create(t, acmeMember, r)
			id := inst.ID
			if tc.id != nil {
				id = tc.id(inst)
			}
			_, err := e.svc.Delete(tc.ctx, id, nil)
			deleting := e.get(t, acmeMember, inst.ID).Deleting()
			if tc.want == "" {
				if err != nil || !deleting {
					t.Fatalf("refused (%v) or not deleting (%v)", err, deleting)
				}
				return
			}
			wantCode(t, err, tc.want)
			if deleting {
				t.Error("refused delete marked the instance")
			}
		})
	}
}

// TestDeleteRetriesAfterAConcurrentUpdate: an update lands between Delete's read and write;
// Delete re-reads and deletes the updated instance instead of failing.
func TestDeleteRetriesAfterAConcurrentUpdate(t *testing.T) {
	e := newEnv(t)
	inst := e.create(t, acmeMember, validCreate())
	svc := e.interfered(t, func() {
		e.update(t, acmeMember, instance.UpdateRequest{ID: inst.ID, Description: ptr("updated meanwhile")})
	})
	got, err := svc.Delete(acmeMember, inst.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	stored := e.get(t, acmeMember, inst.ID)
	for _, g := range []*instance.Instance{got, stored} {
		if !g.Deleting() || g.Generation != 3 || g.Description != "updated meanwhile" ||
			g.Status.ProvisioningStatus != instance.ProvisioningDeprovisioning {
			t.Errorf("generation %d description %q deleting %v", g.Generation, g.Description, g.Deleting())
		}
	}
}

// TestDeleteRacingAnotherDelete: a delete lands between Delete's read and write; the retry
// sees the instance deleting and returns it as it is.
func TestDeleteRacingAnotherDelete(t *testing.T) {
	e := newEnv(t)
	inst := e.create(t, acmeMember, validCreate())
	start := e.now
	first := start.Add(time.Minute)
	svc := e.interfered(t, func() {
		e.now = first
		if _, err := e.svc.Delete(acmeMember, inst.ID, nil); err != nil {
			t.Error(err)
		}
	})
	got, err := svc.Delete(acmeMember, inst.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Generation != 2 || !got.DeletedAt.Equal(first) {
		t.Errorf("generation %d deleted at %v, want 2 and the other delete's %v", got.Generation, got.DeletedAt, first)
	}
	if stored := e.get(t, acmeMember, inst.ID); stored.Generation != 2 || !stored.DeletedAt.Equal(first) {
		t.Errorf("stored generation %d deleted at %v", stored.Generation, stored.DeletedAt)
	}
}
