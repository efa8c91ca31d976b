package instance_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
)

// No existence oracle: what does not exist and what exists but is not the caller's get the
// same answer, word for word apart from the ids, so a caller cannot learn which
// organizations, projects, networks, security groups and SSH CAs other tenants have.
func TestNoExistenceOracle(t *testing.T) {
	e := newEnv(t)
	// gina is a member of globex/prod only; acme and its projects exist, nosuchorg does not.
	type attempt struct {
		name string
		edit func(*instance.CreateRequest)
	}
	for _, pair := range []struct {
		what                string
		missing, notTheirs  attempt
		missingID, theirsID string
	}{
		{"organization",
			attempt{"in an organization that does not exist", func(r *instance.CreateRequest) { r.OrganizationID, r.ProjectID = "nosuchorg", "web" }},
			attempt{"in an organization that is not theirs", func(r *instance.CreateRequest) { r.OrganizationID, r.ProjectID = "acme", "web" }},
			"nosuchorg", "acme"},
		{"project",
			attempt{"in a project that does not exist", func(r *instance.CreateRequest) { r.ProjectID = "nosuchproject" }},
			attempt{"in a project of their organization that is not theirs", func(r *instance.CreateRequest) { r.ProjectID = "staging" }},
			"nosuchproject", "staging"},
		{"network",
			attempt{"on a network that does not exist", func(r *instance.CreateRequest) { r.NetworkID = "net-nope" }},
			attempt{"on another tenant's network", func(r *instance.CreateRequest) { r.NetworkID = "net-acme-web-eu" }},
			"net-nope", "net-acme-web-eu"},
		{"security group, with a valid network",
			attempt{"a group that does not exist", func(r *instance.CreateRequest) {
				r.Networking = &instance.NetworkingRequest{SecurityGroupIDs: []string{"sg-nope"}}
			}},
			attempt{"another tenant's group", func(r *instance.CreateRequest) {
				r.Networking = &instance.NetworkingRequest{SecurityGroupIDs: []string{"sg-acme-web-eu-ssh"}}
			}},
			"sg-nope", "sg-acme-web-eu-ssh"},
		{"security group, with an invalid network",
			attempt{"a group that does not exist", func(r *instance.CreateRequest) {
				r.NetworkID, r.Networking = "net-nope", &instance.NetworkingRequest{SecurityGroupIDs: []string{"sg-nope"}}
			}},
			attempt{"another tenant's group", func(r *instance.CreateRequest) {
				r.NetworkID, r.Networking = "net-nope", &instance.NetworkingRequest{SecurityGroupIDs: []string{"sg-acme-web-eu-ssh"}}
			}},
			"sg-nope", "sg-acme-web-eu-ssh"},
		{"SSH certificate authority",
			attempt{"a CA that does not exist", func(r *instance.CreateRequest) { r.SSHCertificateAuthorityID = ptr("ca-nope") }},
			attempt{"another tenant's CA", func(r *instance.CreateRequest) { r.SSHCertificateAuthorityID = ptr("ca-acme-web") }},
			"ca-nope", "ca-acme-web"},
	} {
		t.Run(pair.what, func(t *testing.T) {
			answer := func(a attempt, id string) string {
				req := globexCreate()
				a.edit(&req)
				_, err := e.svc.Create(globexMember, req)
				if instance.CodeOf(err) != instance.CodeNotFound && !hasNotFound(err) {
					t.Fatalf("%s: %v, want NOT_FOUND", a.name, err)
				}
				return strings.ReplaceAll(err.Error(), id, "<id>")
			}
			missing, notTheirs := answer(pair.missing, pair.missingID), answer(pair.notTheirs, pair.theirsID)
			if missing != notTheirs {
				t.Errorf("the answers tell them apart:\n  %s: %s\n  %s: %s", pair.missing.name, missing, pair.notTheirs.name, notTheirs)
			}
		})
	}
	// Someone who can see the project but not create in it is told so: they know it exists.
	viewer := asGrants("val", auth.Grant{OrganizationID: "globex", ProjectID: "prod", Role: auth.RoleViewer})
	if _, err := e.svc.Create(viewer, globexCreate()); instance.CodeOf(err) != instance.CodeForbidden {
		t.Errorf("a viewer's create: %v, want FORBIDDEN", err)
	}
	if n := e.rdb.DBSize(context.Background()).Val(); n != 0 {
		t.Errorf("refused creates left %d keys in Redis", n)
	}
}

// hasNotFound reports whether every problem of a refused input is NOT_FOUND.
func hasNotFound(err error) bool {
	var inv *instance.Invalid
	if !errors.As(err, &inv) || len(inv.Problems) == 0 {
		return false
	}
	for _, p := range inv.Problems {
		if p.Code != instance.CodeNotFound {
			return false
		}
	}
	return true
}
