package server

import (
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/auth"
)

// TestCreateInstanceReturnsTheQueuedInstance: an accepted create answers with the whole
// instance as stored (generation 1, pending, canonical CIDRs, base64 user data) and an empty,
// non-null userErrors list, and the instance is then readable and charged to the quota.
func TestCreateInstanceReturnsTheQueuedInstance(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	before := time.Now().UTC().Add(-time.Second)
	userData := b64("#cloud-config\npackages: [nginx]\n")
	res, p := a.create(t, tok, with("web-1", map[string]any{
		"description":               "front end",
		"tags":                      []map[string]any{{"name": "env", "value": "prod"}, {"name": "team", "value": "web"}},
		"sshCertificateAuthorityId": "ca-acme-web",
		"networking": map[string]any{
			"securityGroupIds":       []string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-web"},
			"publicIP":               true,
			"allowedSourceAddresses": []string{"203.0.113.7/24", " 2001:db8::1/32"},
		},
		"userData": userData,
	}))
	if res.Status != http.StatusOK || len(res.Errors) > 0 {
		t.Fatalf("status %d: %s", res.Status, res.Raw)
	}
	if !strings.Contains(string(res.Raw), `"userErrors":[]`) {
		t.Errorf("userErrors is not an empty list: %s", res.Raw)
	}
	inst := p.Instance
	if inst == nil {
		t.Fatalf("no instance: %s", res.Raw)
	}
	checks := []struct {
		what      string
		got, want any
	}{
		{"name", inst.Name, "web-1"},
		{"description", inst.Description, "front end"},
		{"tags", inst.Tags, []gqlTag{{"env", "prod"}, {"team", "web"}}},
		{"organizationId", inst.OrganizationID, "acme"},
		{"projectId", inst.ProjectID, "web"},
		{"region", inst.Region != nil && inst.Region.ID == "eu-west" && inst.Region.Name == "EU West", true},
		{"networkId", inst.NetworkID, "net-acme-web-eu"},
		{"flavorId", inst.FlavorID, "g1.small"},
		{"imageId", inst.ImageID, "ubuntu-24.04"},
		{"sshCertificateAuthorityId", deref(inst.SSHCertificateAuthorityID), "ca-acme-web"},
		{"sshCertificateAuthority", inst.SSHCertificateAuthority != nil && inst.SSHCertificateAuthority.ID == "ca-acme-web", true},
		{"securityGroupIds", inst.Networking.SecurityGroupIDs, []string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-web"}},
		{"publicIP", inst.Networking.PublicIP, true},
		{"allowedSourceAddresses", inst.Networking.AllowedSourceAddresses, []string{"203.0.113.0/24", "2001:db8::/32"}},
		{"userData", deref(inst.UserData), userData},
		{"generation", inst.Generation, 1},
		{"observedGeneration", inst.ObservedGeneration, 0},
		{"provisioningStatus", inst.Status.ProvisioningStatus, "PENDING"},
		{"healthStatus", inst.Status.HealthStatus, "UNKNOWN"},
		{"powerState", inst.Status.PowerState, "PENDING"},
		{"privateIP", inst.Status.PrivateIP == nil && inst.Status.PublicIP == nil && inst.Status.MACAddress == nil, true},
		{"conditions", len(inst.Status.Conditions) == 1 && inst.Status.Conditions[0].Type == "Available" &&
			inst.Status.Conditions[0].Status == "FALSE" && inst.Status.Conditions[0].Reason == "Provisioning", true},
		{"createdBy", inst.CreatedBy, "mia"},
		{"updatedBy", inst.UpdatedBy, "mia"},
		{"deletedAt", inst.DeletedAt == nil, true},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %#v, want %#v", c.what, c.got, c.want)
		}
	}
	created, err := time.Parse(time.RFC3339Nano, inst.CreatedAt)
	if err != nil || created.Before(before) || created.After(time.Now().Add(time.Second)) || inst.UpdatedAt != inst.CreatedAt {
		t.Errorf("createdAt %q / updatedAt %q are not the time of the create", inst.CreatedAt, inst.UpdatedAt)
	}

	// What the payload showed is what was stored.
	got := a.mustPost(t, tok, `query($id: ID!) { instance(id: $id) { `+instanceFields+` } }`, map[string]any{"id": inst.ID})
	var stored gqlInstance
	decode(t, got.Data["instance"], &stored)
	if !reflect.DeepEqual(&stored, inst) {
		t.Errorf("stored instance differs from the create payload:\nstored  %+v\ncreated %+v", stored, *inst)
	}

	q := quotaUsed(t, a, tok, "acme")
	want := map[string]int{"servers": 1, "gpus": 0, "publicIPs": 1, "cpus": 2, "memoryGiB": 4}
	if !reflect.DeepEqual(q, want) {
		t.Errorf("quota used = %v, want %v", q, want)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// quotaUsed returns the used amount of every quota kind of the organization.
func quotaUsed(tb testing.TB, a *api, token, org string) map[string]int {
	tb.Helper()
	res := a.mustPost(tb, token, `query($org: ID!) { quota(organizationId: $org) { limits { kind used } } }`, map[string]any{"org": org})
	var q struct {
		Limits []struct {
			Kind string `json:"kind"`
			Used int    `json:"used"`
		} `json:"limits"`
	}
	decode(tb, res.Data["quota"], &q)
	out := map[string]int{}
	for _, l := range q.Limits {
		out[l.Kind] = l.Used
	}
	return out
}

// TestCreateRefusedWritesNothing: each invalid create is refused with instance null and the
// exact user errors (field path and code), and leaves every Redis key exactly as it was.
func TestCreateRefusedWritesNothing(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	// Something already stored, so "writes nothing" also covers changes to existing keys.
	a.mustCreate(t, tok, createInput("existing"))
	gzip := string([]byte{0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00})

	tests := []struct {
		name   string
		fields map[string]any
		want   []fieldCode
	}{
		{"name starts with a dash", map[string]any{"name": "-web"}, []fieldCode{fc("BAD_USER_INPUT", "input", "name")}},
		{"name with a space", map[string]any{"name": "web 1"}, []fieldCode{fc("BAD_USER_INPUT", "input", "name")}},
		{"name empty", map[string]any{"name": ""}, []fieldCode{fc("BAD_USER_INPUT", "input", "name")}},
		{"name of 64 characters", map[string]any{"name": strings.Repeat("a", 64)}, []fieldCode{fc("BAD_USER_INPUT", "input", "name")}},
		{"description too long", map[string]any{"description": strings.Repeat("d", 1025)}, []fieldCode{fc("BAD_USER_INPUT", "input", "description")}},
		{"reserved tag", map[string]any{"tags": []map[string]any{{"name": "compute/instance", "value": "x"}}}, []fieldCode{fc("BAD_USER_INPUT", "input", "tags", "0", "name")}},
		{"duplicate tag", map[string]any{"tags": []map[string]any{{"name": "a", "value": "1"}, {"name": "a", "value": "2"}}}, []fieldCode{fc("BAD_USER_INPUT", "input", "tags", "1", "name")}},
		{"unknown network", map[string]any{"networkId": "net-nope"}, []fieldCode{fc("NOT_FOUND", "input", "networkId")}},
		{"network of another project", map[string]any{"networkId": "net-acme-data-eu"}, []fieldCode{fc("NOT_FOUND", "input", "networkId")}},
		{"network of another organization", map[string]any{"networkId": "net-globex-prod-eu"}, []fieldCode{fc("NOT_FOUND", "input", "networkId")}},
		{"unknown flavor", map[string]any{"flavorId": "g9.huge"}, []fieldCode{fc("NOT_FOUND", "input", "flavorId")}},
		{"flavor not offered in the region", map[string]any{"networkId": "net-acme-web-us", "flavorId": "gpu.a100x2"}, []fieldCode{fc("UNPROCESSABLE", "input", "flavorId")}},
		{"unknown image", map[string]any{"imageId": "beos-5"}, []fieldCode{fc("NOT_FOUND", "input", "imageId")}},
		{"image not ready", map[string]any{"imageId": "fedora-41"}, []fieldCode{fc("UNPROCESSABLE", "input", "imageId")}},
		{"architecture mismatch", map[string]any{"flavorId": "a1.medium"}, []fieldCode{fc("UNPROCESSABLE", "input", "imageId")}},
		{"image larger than the disk", map[string]any{"imageId": "windows-2022"}, []fieldCode{fc("UNPROCESSABLE", "input", "imageId")}},
		{"baremetal image on a virtual flavor", map[string]any{"flavorId": "g1.large", "imageId": "debian-12-metal"}, []fieldCode{fc("UNPROCESSABLE", "input", "imageId")}},
		{"virtualized image on baremetal", map[string]any{"flavorId": "bm.metal", "imageId": "rocky-9"}, []fieldCode{fc("UNPROCESSABLE", "input", "imageId")}},
		{"security group of another network", map[string]any{"networking": map[string]any{"securityGroupIds": []string{"sg-acme-web-eu-ssh", "sg-acme-web-us-ssh"}}},
			[]fieldCode{fc("NOT_FOUND", "input", "networking", "securityGroupIds", "1")}},
		{"security group twice", map[string]any{"networking": map[string]any{"securityGroupIds": []string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-ssh"}}},
			[]fieldCode{fc("BAD_USER_INPUT", "input", "networking", "securityGroupIds", "1")}},
		{"source address not a CIDR", map[string]any{"networking": map[string]any{"allowedSourceAddresses": []string{"10.0.0.0/8", "everyone"}}},
			[]fieldCode{fc("BAD_USER_INPUT", "input", "networking", "allowedSourceAddresses", "1")}},
		{"SSH CA of another project", map[string]any{"sshCertificateAuthorityId": "ca-acme-data"}, []fieldCode{fc("NOT_FOUND", "input", "sshCertificateAuthorityId")}},
		{"SSH CA of another organization", map[string]any{"sshCertificateAuthorityId": "ca-globex-prod"}, []fieldCode{fc("NOT_FOUND", "input", "sshCertificateAuthorityId")}},
		{"user data not base64", map[string]any{"userData": "#cloud-config!!"}, []fieldCode{fc("BAD_USER_INPUT", "input", "userData")}},
		{"user data not cloud-init", map[string]any{"userData": b64("hello world\n")}, []fieldCode{fc("BAD_USER_INPUT", "input", "userData")}},
		{"gzip user data with an SSH CA", map[string]any{"userData": b64(gzip), "sshCertificateAuthorityId": "ca-acme-web"}, []fieldCode{fc("UNPROCESSABLE", "input", "userData")}},
		{"user data over 32 KiB", map[string]any{"userData": b64("#!/bin/sh\n" + strings.Repeat("#", 32<<10))}, []fieldCode{fc("BAD_USER_INPUT", "input", "userData")}},
		{"duplicate name", map[string]any{"name": "existing"}, []fieldCode{fc("CONFLICT", "input", "name")}},
		{"every problem at once", map[string]any{
			"name":                      "-bad-",
			"tags":                      []map[string]any{{"name": "a", "value": "1"}, {"name": "a", "value": "2"}},
			"flavorId":                  "a1.medium",
			"networking":                map[string]any{"securityGroupIds": []string{"sg-acme-web-eu-ssh", "sg-globex-prod-eu-ssh"}, "allowedSourceAddresses": []string{"10.0.0.0/8", "bogus"}},
			"sshCertificateAuthorityId": "ca-acme-data",
			"userData":                  b64("hello"),
		}, []fieldCode{
			fc("BAD_USER_INPUT", "input", "name"),
			fc("BAD_USER_INPUT", "input", "tags", "1", "name"),
			fc("UNPROCESSABLE", "input", "imageId"),
			fc("NOT_FOUND", "input", "networking", "securityGroupIds", "1"),
			fc("BAD_USER_INPUT", "input", "networking", "allowedSourceAddresses", "1"),
			fc("NOT_FOUND", "input", "sshCertificateAuthorityId"),
			fc("BAD_USER_INPUT", "input", "userData"),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := a.storeState(t)
			res, p := a.create(t, tok, with("web-1", tt.fields))
			wantUserErrors(t, res, p, tt.want...)
			if after := a.storeState(t); !reflect.DeepEqual(before, after) {
				t.Errorf("a refused create changed Redis: %d keys before, %d after", len(before), len(after))
			}
		})
	}
	// The comparison does see writes: an accepted create changes the state.
	before := a.storeState(t)
	a.mustCreate(t, tok, createInput("web-1"))
	if reflect.DeepEqual(before, a.storeState(t)) {
		t.Error("storeState did not notice an accepted create")
	}
}

// TestCreateQuotaExceeded: quota refusals name the kind's field, both when only the quota
// refuses (the atomic check in the store) and alongside other problems (the pre-check), and
// write nothing.
func TestCreateQuotaExceeded(t *testing.T) {
	a := newAPI(t)
	admin := a.admin(t)
	a.mustPost(t, admin, `mutation { setQuota(input: {organizationId: "acme", limits: [{kind: "servers", limit: 1}, {kind: "publicIPs", limit: 0}]}) { userErrors { code } } }`, nil)
	a.mustCreate(t, admin, createInput("one"))

	tests := []struct {
		name   string
		fields map[string]any
		want   []fieldCode
	}{
		{"servers", nil, []fieldCode{fc("QUOTA_EXCEEDED", "input", "flavorId")}},
		{"servers and public IPs", map[string]any{"networking": map[string]any{"publicIP": true}},
			[]fieldCode{fc("QUOTA_EXCEEDED", "input", "flavorId"), fc("QUOTA_EXCEEDED", "input", "networking", "publicIP")}},
		{"with a validation problem", map[string]any{"imageId": "fedora-41"},
			[]fieldCode{fc("UNPROCESSABLE", "input", "imageId"), fc("QUOTA_EXCEEDED", "input", "flavorId")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := a.storeState(t)
			res, p := a.create(t, admin, with("two", tt.fields))
			wantUserErrors(t, res, p, tt.want...)
			for _, e := range p.UserErrors {
				if e.Code == "QUOTA_EXCEEDED" && !strings.Contains(e.Message, "limit") {
					t.Errorf("quota message %q does not state the limit", e.Message)
				}
			}
			if after := a.storeState(t); !reflect.DeepEqual(before, after) {
				t.Error("a refused create changed Redis")
			}
		})
	}
}

// TestCreateDuplicateNameConflictsPerNetwork: a name is unique per network: the same name on
// the same network is CONFLICT on ["input","name"], on another network it is fine, and after
// the conflict the first instance is untouched.
func TestCreateDuplicateNameConflictsPerNetwork(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	first := a.mustCreate(t, tok, createInput("db"))
	before := a.storeState(t)
	res, p := a.create(t, tok, createInput("db"))
	wantUserErrors(t, res, p, fc("CONFLICT", "input", "name"))
	if !reflect.DeepEqual(before, a.storeState(t)) {
		t.Error("a conflicting create changed Redis")
	}
	other := a.mustCreate(t, tok, with("db", map[string]any{"networkId": "net-acme-web-us"}))
	if other.ID == first.ID {
		t.Error("two instances share an id")
	}
}

// TestCreateAuthorization: a caller who can read the project but not create in it is
// FORBIDDEN; one who cannot read it (other organization or project, unknown project) is told
// NOT_FOUND. All are top-level errors with HTTP 200, and nothing is written.
func TestCreateAuthorization(t *testing.T) {
	a := newAPI(t)
	tests := []struct {
		name  string
		grant auth.Grant
		input map[string]any
		code  string
	}{
		{"viewer", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleViewer}, createInput("x"), "FORBIDDEN"},
		{"org-wide viewer", auth.Grant{OrganizationID: "acme", Role: auth.RoleViewer}, createInput("x"), "FORBIDDEN"},
		{"operator", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleOperator}, createInput("x"), "FORBIDDEN"},
		{"member of another organization", auth.Grant{OrganizationID: "globex", Role: auth.RoleMember}, createInput("x"), "NOT_FOUND"},
		{"member of another project", auth.Grant{OrganizationID: "acme", ProjectID: "data", Role: auth.RoleMember}, createInput("x"), "NOT_FOUND"},
		{"unknown project", auth.Grant{OrganizationID: "acme", Role: auth.RoleAdmin}, with("x", map[string]any{"projectId": "nope"}), "NOT_FOUND"},
		{"unknown organization", auth.Grant{OrganizationID: "acme", Role: auth.RoleAdmin}, with("x", map[string]any{"organizationId": "initech"}), "NOT_FOUND"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := a.storeState(t)
			res, _ := a.create(t, a.token(t, "u", tt.grant), tt.input)
			wantError(t, res, http.StatusOK, tt.code)
			if res.Data != nil {
				t.Errorf("data = %v, want null (the payload is non-null)", res.Data)
			}
			if len(res.Errors) == 1 && !reflect.DeepEqual(res.Errors[0].Path, []any{"createInstance"}) {
				t.Errorf("error path = %v, want [createInstance]", res.Errors[0].Path)
			}
			if !reflect.DeepEqual(before, a.storeState(t)) {
				t.Error("a refused create changed Redis")
			}
		})
	}
}
