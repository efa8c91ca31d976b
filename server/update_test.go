package server

import (
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/computeql/computeql/auth"
)

// TestUpdateOmittedVersusExplicitNull: for the clearable fields sshCertificateAuthorityId and
// userData, leaving the field out keeps it, and an explicit null (in variables or inline)
// clears it, which is a rebuild and so needs allowRebuild.
func TestUpdateOmittedVersusExplicitNull(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	userData := b64("#cloud-config\nruncmd: [true]\n")
	newInstance := func(t *testing.T, name string) *gqlInstance {
		return a.mustCreate(t, tok, with(name, map[string]any{"userData": userData, "sshCertificateAuthorityId": "ca-acme-web"}))
	}

	t.Run("omitted fields stay", func(t *testing.T) {
		inst := newInstance(t, "keep")
		res, p := a.update(t, tok, map[string]any{"id": inst.ID, "description": "only this"})
		if len(res.Errors) > 0 || len(p.UserErrors) > 0 || p.Instance == nil {
			t.Fatalf("update refused: %s", res.Raw)
		}
		if deref(p.Instance.UserData) != userData || deref(p.Instance.SSHCertificateAuthorityID) != "ca-acme-web" {
			t.Errorf("omitted fields changed: userData %s, CA %s", deref(p.Instance.UserData), deref(p.Instance.SSHCertificateAuthorityID))
		}
		if p.Instance.Description != "only this" || p.Instance.Generation != 2 {
			t.Errorf("description %q generation %d, want the change at generation 2", p.Instance.Description, p.Instance.Generation)
		}
	})

	t.Run("explicit null without allowRebuild is refused", func(t *testing.T) {
		inst := newInstance(t, "refuse")
		before := a.storeState(t)
		res, p := a.update(t, tok, map[string]any{"id": inst.ID, "userData": nil, "sshCertificateAuthorityId": nil})
		wantUserErrors(t, res, p,
			fc("UNPROCESSABLE", "input", "sshCertificateAuthorityId"),
			fc("UNPROCESSABLE", "input", "userData"))
		if !reflect.DeepEqual(before, a.storeState(t)) {
			t.Error("a refused update changed Redis")
		}
	})

	clear := []struct {
		name string
		send func(t *testing.T, id string) (*gqlResponse, payload)
	}{
		{"null in variables", func(t *testing.T, id string) (*gqlResponse, payload) {
			return a.update(t, tok, map[string]any{"id": id, "userData": nil, "allowRebuild": true})
		}},
		{"null inline", func(t *testing.T, id string) (*gqlResponse, payload) {
			return a.mutate(t, tok, `mutation($id: ID!) { updateInstance(input: {id: $id, userData: null, allowRebuild: true}) {
				instance { `+instanceFields+` } userErrors { field code message } } }`, "updateInstance", map[string]any{"id": id})
		}},
	}
	for _, tt := range clear {
		t.Run("userData "+tt.name+" clears it", func(t *testing.T) {
			inst := newInstance(t, strings.ReplaceAll(tt.name, " ", "-"))
			res, p := tt.send(t, inst.ID)
			if len(res.Errors) > 0 || len(p.UserErrors) > 0 || p.Instance == nil {
				t.Fatalf("update refused: %s", res.Raw)
			}
			if p.Instance.UserData != nil {
				t.Errorf("userData = %q, want null", *p.Instance.UserData)
			}
			if deref(p.Instance.SSHCertificateAuthorityID) != "ca-acme-web" {
				t.Errorf("the omitted SSH CA changed to %s", deref(p.Instance.SSHCertificateAuthorityID))
			}
			if p.Instance.Generation != 2 {
				t.Errorf("generation = %d, want 2", p.Instance.Generation)
			}
			// And it stays cleared.
			got := a.mustPost(t, tok, `query($id: ID!) { instance(id: $id) { userData } }`, map[string]any{"id": inst.ID})
			if got.Data["instance"].(map[string]any)["userData"] != nil {
				t.Errorf("stored userData not cleared: %s", got.Raw)
			}
		})
	}

	t.Run("sshCertificateAuthorityId null clears it", func(t *testing.T) {
		inst := newInstance(t, "no-ca")
		res, p := a.update(t, tok, map[string]any{"id": inst.ID, "sshCertificateAuthorityId": nil, "allowRebuild": true})
		if len(res.Errors) > 0 || len(p.UserErrors) > 0 || p.Instance == nil {
			t.Fatalf("update refused: %s", res.Raw)
		}
		if p.Instance.SSHCertificateAuthorityID != nil || p.Instance.SSHCertificateAuthority != nil {
			t.Errorf("SSH CA not cleared: %s", res.Raw)
		}
		if deref(p.Instance.UserData) != userData {
			t.Error("the omitted userData changed")
		}
	})
}

// TestUpdateRebuildFieldsNeedAllowRebuild: flavor, image, SSH CA and user data changes are
// refused without allowRebuild, with one UNPROCESSABLE error naming each field, and accepted
// with it; unchanged values and in-place fields need no consent.
func TestUpdateRebuildFieldsNeedAllowRebuild(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	inst := a.mustCreate(t, tok, with("rebuild", map[string]any{"sshCertificateAuthorityId": "ca-acme-web"}))
	change := map[string]any{
		"id":                        inst.ID,
		"flavorId":                  "g1.medium",
		"imageId":                   "rocky-9",
		"sshCertificateAuthorityId": nil,
		"userData":                  b64("#!/bin/sh\necho hi\n"),
	}

	before := a.storeState(t)
	res, p := a.update(t, tok, change)
	wantUserErrors(t, res, p,
		fc("UNPROCESSABLE", "input", "flavorId"),
		fc("UNPROCESSABLE", "input", "imageId"),
		fc("UNPROCESSABLE", "input", "sshCertificateAuthorityId"),
		fc("UNPROCESSABLE", "input", "userData"))
	for _, e := range p.UserErrors {
		if !strings.Contains(e.Message, "allowRebuild") {
			t.Errorf("message %q does not tell how to proceed", e.Message)
		}
	}
	if !reflect.DeepEqual(before, a.storeState(t)) {
		t.Error("a refused update changed Redis")
	}

	// allowRebuild: false is the same as leaving it out.
	change["allowRebuild"] = false
	res, p = a.update(t, tok, change)
	if len(p.UserErrors) != 4 {
		t.Errorf("allowRebuild false: %s", res.Raw)
	}

	// Unchanged values and in-place changes need no consent.
	res, p = a.update(t, tok, map[string]any{
		"id": inst.ID, "flavorId": "g1.small", "imageId": "ubuntu-24.04", "sshCertificateAuthorityId": "ca-acme-web",
		"name":       "rebuild",
		"networking": map[string]any{"securityGroupIds": []string{"sg-acme-web-eu-web"}, "allowedSourceAddresses": []string{"198.51.100.9/24"}},
	})
	if len(res.Errors) > 0 || len(p.UserErrors) > 0 || p.Instance == nil {
		t.Fatalf("in-place update refused: %s", res.Raw)
	}
	if got := p.Instance.Networking; !reflect.DeepEqual(got.SecurityGroupIDs, []string{"sg-acme-web-eu-web"}) ||
		!reflect.DeepEqual(got.AllowedSourceAddresses, []string{"198.51.100.0/24"}) || p.Instance.Generation != 2 {
		t.Errorf("in-place update gave %+v at generation %d", got, p.Instance.Generation)
	}

	change["allowRebuild"] = true
	res, p = a.update(t, tok, change)
	if len(res.Errors) > 0 || len(p.UserErrors) > 0 || p.Instance == nil {
		t.Fatalf("rebuild refused: %s", res.Raw)
	}
	got := p.Instance
	if got.FlavorID != "g1.medium" || got.ImageID != "rocky-9" || got.SSHCertificateAuthorityID != nil ||
		deref(got.UserData) != change["userData"] || got.Generation != 3 {
		t.Errorf("rebuild gave %s", res.Raw)
	}
	// The new flavor is charged instead of the old one.
	if used := quotaUsed(t, a, tok, "acme"); used["cpus"] != 4 || used["memoryGiB"] != 16 || used["servers"] != 1 {
		t.Errorf("quota after the flavor change = %v", used)
	}
}

// TestUpdateRefusals: other update refusals, each a userError on the right field (or a
// top-level error when the caller may not act), and none of them writes.
func TestUpdateRefusals(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	inst := a.mustCreate(t, tok, createInput("upd"))

	tests := []struct {
		name  string
		token string
		input map[string]any
		want  []fieldCode // userErrors, when the refusal is in the payload
		code  string      // top-level code otherwise
	}{
		{"rename", tok, map[string]any{"name": "other"}, []fieldCode{fc("UNPROCESSABLE", "input", "name")}, ""},
		{"stale expectedGeneration", tok, map[string]any{"expectedGeneration": 7, "description": "x"}, []fieldCode{fc("CONFLICT", "input", "expectedGeneration")}, ""},
		{"description too long", tok, map[string]any{"description": strings.Repeat("x", 1025)}, []fieldCode{fc("BAD_USER_INPUT", "input", "description")}, ""},
		{"security group of another network", tok, map[string]any{"networking": map[string]any{"securityGroupIds": []string{"sg-acme-data-eu-ssh"}}},
			[]fieldCode{fc("NOT_FOUND", "input", "networking", "securityGroupIds", "0")}, ""},
		{"unknown flavor", tok, map[string]any{"flavorId": "nope", "allowRebuild": true}, []fieldCode{fc("NOT_FOUND", "input", "flavorId")}, ""},
		{"viewer", a.token(t, "v", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleViewer}), map[string]any{"description": "x"}, nil, "FORBIDDEN"},
		{"operator", a.token(t, "o", auth.Grant{OrganizationID: "acme", Role: auth.RoleOperator}), map[string]any{"description": "x"}, nil, "FORBIDDEN"},
		{"other organization", a.token(t, "g", auth.Grant{OrganizationID: "globex", Role: auth.RoleAdmin}), map[string]any{"description": "x"}, nil, "NOT_FOUND"},
		{"other project", a.token(t, "d", auth.Grant{OrganizationID: "acme", ProjectID: "data", Role: auth.RoleMember}), map[string]any{"description": "x"}, nil, "NOT_FOUND"},
		{"malformed id", tok, map[string]any{"id": "nope"}, nil, "BAD_USER_INPUT"},
		{"unknown id", tok, map[string]any{"id": "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f"}, nil, "NOT_FOUND"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			input := map[string]any{"id": inst.ID}
			for k, v := range tt.input {
				input[k] = v
			}
			before := a.storeState(t)
			res, p := a.update(t, tt.token, input)
			if tt.code != "" {
				wantError(t, res, http.StatusOK, tt.code)
			} else {
				wantUserErrors(t, res, p, tt.want...)
			}
			if !reflect.DeepEqual(before, a.storeState(t)) {
				t.Error("a refused update changed Redis")
			}
		})
	}
}

// TestUpdateExpectedGeneration: an update that names the current generation succeeds and
// moves it on; repeating it with the same, now stale, generation is CONFLICT.
func TestUpdateExpectedGeneration(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	inst := a.mustCreate(t, tok, createInput("cas"))
	res, p := a.update(t, tok, map[string]any{"id": inst.ID, "expectedGeneration": 1, "description": "first"})
	if len(res.Errors) > 0 || len(p.UserErrors) > 0 || p.Instance == nil || p.Instance.Generation != 2 {
		t.Fatalf("update at the current generation: %s", res.Raw)
	}
	res, p = a.update(t, tok, map[string]any{"id": inst.ID, "expectedGeneration": 1, "description": "second"})
	wantUserErrors(t, res, p, fc("CONFLICT", "input", "expectedGeneration"))
	got := a.mustPost(t, tok, `query($id: ID!) { instance(id: $id) { description generation } }`, map[string]any{"id": inst.ID})
	if d := got.Data["instance"].(map[string]any); d["description"] != "first" || d["generation"] != float64(2) {
		t.Errorf("after the stale update: %s", got.Raw)
	}
}

// TestDeleteInstance: delete marks the instance deleted and deprovisioning at once; deleting
// again returns the same instance without error; a deleting instance cannot be updated and its
// name stays claimed until workers forget it.
func TestDeleteInstance(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	inst := a.mustCreate(t, tok, createInput("doomed"))

	res, p := a.remove(t, tok, inst.ID)
	if res.Status != http.StatusOK || len(res.Errors) > 0 || len(p.UserErrors) > 0 || p.Instance == nil {
		t.Fatalf("delete: %s", res.Raw)
	}
	if !strings.Contains(string(res.Raw), `"userErrors":[]`) {
		t.Errorf("userErrors is not an empty list: %s", res.Raw)
	}
	first := p.Instance
	if first.DeletedAt == nil || first.Status.ProvisioningStatus != "DEPROVISIONING" {
		t.Fatalf("deleted instance: deletedAt %v, status %s", first.DeletedAt, first.Status.ProvisioningStatus)
	}
	if c := first.Status.Conditions; len(c) != 1 || c[0].Type != "Available" || c[0].Status != "FALSE" || c[0].Reason != "Deprovisioning" {
		t.Errorf("conditions = %+v, want Available FALSE Deprovisioning", c)
	}
	if first.UpdatedAt != *first.DeletedAt || first.UpdatedBy != "mia" {
		t.Errorf("updatedAt %s by %s, want the deletion's time and caller", first.UpdatedAt, first.UpdatedBy)
	}

	before := a.storeState(t)
	res, p = a.remove(t, tok, inst.ID)
	if res.Status != http.StatusOK || len(res.Errors) > 0 || len(p.UserErrors) > 0 || p.Instance == nil {
		t.Fatalf("second delete: %s", res.Raw)
	}
	if !reflect.DeepEqual(p.Instance, first) {
		t.Errorf("second delete returned another result:\n%+v\nwant\n%+v", *p.Instance, *first)
	}
	if !reflect.DeepEqual(before, a.storeState(t)) {
		t.Error("deleting a deleting instance changed Redis")
	}

	got := a.mustPost(t, tok, `query($id: ID!) { instance(id: $id) { deletedAt status { provisioningStatus } } }`, map[string]any{"id": inst.ID})
	if d := got.Data["instance"].(map[string]any); d["deletedAt"] != *first.DeletedAt {
		t.Errorf("stored deletedAt: %s", got.Raw)
	}

	res, p = a.update(t, tok, map[string]any{"id": inst.ID, "description": "too late"})
	wantUserErrors(t, res, p, fc("UNPROCESSABLE", "input", "id"))

	res, p = a.create(t, tok, createInput("doomed"))
	wantUserErrors(t, res, p, fc("CONFLICT", "input", "name"))
}

// TestDeleteAuthorization: only members may delete; others get the top-level code and the
// instance is untouched.
func TestDeleteAuthorization(t *testing.T) {
	a := newAPI(t)
	inst := a.mustCreate(t, a.member(t), createInput("keep"))
	tests := []struct {
		name string
		tok  string
		id   string
		code string
	}{
		{"viewer", a.token(t, "v", auth.Grant{OrganizationID: "acme", Role: auth.RoleViewer}), inst.ID, "FORBIDDEN"},
		{"operator", a.token(t, "o", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleOperator}), inst.ID, "FORBIDDEN"},
		{"other organization", a.token(t, "g", auth.Grant{OrganizationID: "globex", Role: auth.RoleAdmin}), inst.ID, "NOT_FOUND"},
		{"unknown id", a.member(t), "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f", "NOT_FOUND"},
		{"malformed id", a.member(t), "'; DEL *", "BAD_USER_INPUT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := a.storeState(t)
			res, _ := a.remove(t, tt.tok, tt.id)
			wantError(t, res, http.StatusOK, tt.code)
			if !reflect.DeepEqual(before, a.storeState(t)) {
				t.Error("a refused delete changed Redis")
			}
		})
	}
}
