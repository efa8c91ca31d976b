package instance_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
)

func TestGetVisibility(t *testing.T) {
	e := newEnv(t)
	web := e.create(t, acmeMember, validCreate())
	data := validCreate()
	data.ProjectID, data.NetworkID = "data", "net-acme-data-eu"
	dataInst := e.create(t, as("d", "acme", "data", auth.RoleMember), data)
	globex := e.create(t, globexMember, globexCreate())

	for _, tc := range []struct {
		name string
		ctx  context.Context
		id   string
		want instance.Code
	}{
		{"project viewer", acmeViewer, web.ID, ""},
		{"project operator", acmeOperator, web.ID, ""},
		{"org-wide viewer", as("v", "acme", "", auth.RoleViewer), web.ID, ""},
		{"org-wide viewer, other project", as("v", "acme", "", auth.RoleViewer), dataInst.ID, ""},
		{"viewer of acme/data reading acme/web", as("v", "acme", "data", auth.RoleViewer), web.ID, NotFound},
		{"member of acme/web reading acme/data", acmeMember, dataInst.ID, NotFound},
		{"member of another org with the exact id", globexMember, web.ID, NotFound},
		{"admin of another org with the exact id", globexAdmin, web.ID, NotFound},
		{"acme admin reading globex", acmeAdmin, globex.ID, NotFound},
		{"grants in both orgs read globex", asGrants("x",
			auth.Grant{OrganizationID: "acme", Role: auth.RoleViewer},
			auth.Grant{OrganizationID: "globex", ProjectID: "prod", Role: auth.RoleViewer}), globex.ID, ""},
		{"grants in both orgs read acme", asGrants("x",
			auth.Grant{OrganizationID: "globex", ProjectID: "prod", Role: auth.RoleViewer},
			auth.Grant{OrganizationID: "acme", Role: auth.RoleViewer}), web.ID, ""},
		{"no grants", asGrants("x"), web.ID, NotFound},
		{"no principal", nobody, web.ID, instance.CodeUnauthenticated},
		{"unknown id", acmeAdmin, uuid.NewString(), NotFound},
		{"malformed id", acmeAdmin, "not-an-id", BadInput},
		{"upper-case id", acmeAdmin, "0190C7A4-6B1E-7C3D-9F00-1A2B3C4D5E6F", NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := e.svc.Get(tc.ctx, tc.id)
			if tc.want != "" {
				wantCode(t, err, tc.want)
				if got != nil {
					t.Errorf("refused get returned %+v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.ID != tc.id {
				t.Errorf("got %s, want %s", got.ID, tc.id)
			}
		})
	}
}
