package server

import (
	"encoding/base64"
	"reflect"
	"testing"

	"github.com/computeql/computeql/auth"
)

// instanceFields selects every field of an Instance the tests look at.
const instanceFields = `id name description tags { name value } organizationId projectId region { id name }
  networkId flavorId imageId sshCertificateAuthorityId sshCertificateAuthority { id }
  networking { securityGroupIds publicIP allowedSourceAddresses }
  userData deletionProtection generation observedGeneration
  status { provisioningStatus healthStatus powerState privateIP publicIP macAddress conditions { type status reason } }
  createdAt createdBy updatedAt updatedBy deletedAt`

// gqlInstance is an Instance as the API returns it with instanceFields.
type gqlInstance struct {
	ID             string   `json:"id"`
	Name           string   `json:"name"`
	Description    string   `json:"description"`
	Tags           []gqlTag `json:"tags"`
	OrganizationID string   `json:"organizationId"`
	ProjectID      string   `json:"projectId"`
	Region         *struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	} `json:"region"`
	NetworkID                 string  `json:"networkId"`
	FlavorID                  string  `json:"flavorId"`
	ImageID                   string  `json:"imageId"`
	SSHCertificateAuthorityID *string `json:"sshCertificateAuthorityId"`
	SSHCertificateAuthority   *struct {
		ID string `json:"id"`
	} `json:"sshCertificateAuthority"`
	Networking struct {
		SecurityGroupIDs       []string `json:"securityGroupIds"`
		PublicIP               bool     `json:"publicIP"`
		AllowedSourceAddresses []string `json:"allowedSourceAddresses"`
	} `json:"networking"`
	UserData           *string `json:"userData"`
	DeletionProtection bool    `json:"deletionProtection"`
	Generation         int     `json:"generation"`
	ObservedGeneration int     `json:"observedGeneration"`
	Status             struct {
		ProvisioningStatus string  `json:"provisioningStatus"`
		HealthStatus       string  `json:"healthStatus"`
		PowerState         string  `json:"powerState"`
		PrivateIP          *string `json:"privateIP"`
		PublicIP           *string `json:"publicIP"`
		MACAddress         *string `json:"macAddress"`
		Conditions         []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
			Reason string `json:"reason"`
		} `json:"conditions"`
	} `json:"status"`
	CreatedAt string  `json:"createdAt"`
	CreatedBy string  `json:"createdBy"`
	UpdatedAt string  `json:"updatedAt"`
	UpdatedBy string  `json:"updatedBy"`
	DeletedAt *string `json:"deletedAt"`
}

type gqlTag struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// userError is one entry of a payload's userErrors.
type userError struct {
	Field   []string `json:"field"`
	Code    string   `json:"code"`
	Message string   `json:"message"`
}

// payload is a mutation payload: the resulting instance (or null) and the userErrors.
type payload struct {
	Instance   *gqlInstance `json:"instance"`
	UserErrors []userError  `json:"userErrors"`
}

// fieldCode is what tests compare of a user error: where and what, not the wording.
type fieldCode struct {
	Field []string
	Code  string
}

func fieldCodes(errs []userError) []fieldCode {
	out := []fieldCode{}
	for _, e := range errs {
		out = append(out, fieldCode{e.Field, e.Code})
	}
	return out
}

func fc(code string, field ...string) fieldCode { return fieldCode{Field: field, Code: code} }

// wantUserErrors checks that a mutation was refused with exactly these user errors, in order,
// each with a message, and no top-level error.
func wantUserErrors(tb testing.TB, res *gqlResponse, p payload, want ...fieldCode) {
	tb.Helper()
	if res.Status != 200 || len(res.Errors) > 0 {
		tb.Fatalf("status %d, top-level errors: %s", res.Status, res.Raw)
	}
	if p.Instance != nil {
		tb.Errorf("refused mutation returned an instance: %s", res.Raw)
	}
	if got := fieldCodes(p.UserErrors); !reflect.DeepEqual(got, want) {
		tb.Errorf("userErrors = %+v\nwant        %+v\nbody %s", got, want, res.Raw)
	}
	for _, e := range p.UserErrors {
		if e.Message == "" {
			tb.Errorf("user error %v has no message", e.Field)
		}
	}
}

const createFull = `mutation($input: CreateInstanceInput!) {
  createInstance(input: $input) { instance { ` + instanceFields + ` } userErrors { field code message } }
}`

const updateFull = `mutation($input: UpdateInstanceInput!) {
  updateInstance(input: $input) { instance { ` + instanceFields + ` } userErrors { field code message } }
}`

const deleteFull = `mutation($id: ID!) {
  deleteInstance(input: {id: $id}) { instance { ` + instanceFields + ` } userErrors { field code message } }
}`

// create sends createInstance with the full selection and decodes its payload; update and
// remove do the same for updateInstance and deleteInstance.
func (a *api) create(tb testing.TB, token string, input map[string]any) (*gqlResponse, payload) {
	tb.Helper()
	return a.mutate(tb, token, createFull, "createInstance", map[string]any{"input": input})
}

func (a *api) update(tb testing.TB, token string, input map[string]any) (*gqlResponse, payload) {
	tb.Helper()
	return a.mutate(tb, token, updateFull, "updateInstance", map[string]any{"input": input})
}

func (a *api) remove(tb testing.TB, token, id string) (*gqlResponse, payload) {
	tb.Helper()
	return a.mutate(tb, token, deleteFull, "deleteInstance", map[string]any{"id": id})
}

func (a *api) mutate(tb testing.TB, token, doc, field string, vars map[string]any) (*gqlResponse, payload) {
	tb.Helper()
	res := a.post(tb, token, doc, vars)
	var p payload
	if res.Data != nil && res.Data[field] != nil {
		decode(tb, res.Data[field], &p)
	}
	return res, p
}

// mustCreate creates an instance and fails the test unless it was accepted.
func (a *api) mustCreate(tb testing.TB, token string, input map[string]any) *gqlInstance {
	tb.Helper()
	res, p := a.create(tb, token, input)
	if res.Status != 200 || len(res.Errors) > 0 || p.Instance == nil || len(p.UserErrors) > 0 {
		tb.Fatalf("create %v refused: %s", input["name"], res.Raw)
	}
	return p.Instance
}

// with returns a copy of createInput(name) with the fields replaced (a nil value deletes one).
func with(name string, fields map[string]any) map[string]any {
	in := createInput(name)
	for k, v := range fields {
		if v == nil {
			delete(in, k)
			continue
		}
		in[k] = v
	}
	return in
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// member returns a token with the member role in acme/web.
func (a *api) member(tb testing.TB) string {
	return a.token(tb, "mia", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleMember})
}
