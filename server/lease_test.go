package server

import (
	"maps"
	"testing"
	"time"

	"github.com/computeql/computeql/redistest"
)

const leaseFields = `mutation($in: CreateInstanceInput!) { createInstance(input: $in) {
  instance { id expiresAt expiryAction } userErrors { field code message } } }`

const leaseUpdate = `mutation($in: UpdateInstanceInput!) { updateInstance(input: $in) {
  instance { id expiresAt expiryAction } userErrors { field code message } } }`

// leasePayload is a create or update payload as the documents above select it.
type leasePayload struct {
	Instance *struct {
		ID           string  `json:"id"`
		ExpiresAt    *string `json:"expiresAt"`
		ExpiryAction *string `json:"expiryAction"`
	} `json:"instance"`
	UserErrors []userError `json:"userErrors"`
}

// TestLeaseRules: a lease ends in the future, at most ten years ahead; its action defaults to
// STOP and needs a lease; an update extends, changes or ends it (null); every refusal is on
// its field, with its code, and writes nothing.
func TestLeaseRules(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	at := func(d time.Duration) string { return time.Now().Add(d).UTC().Format(time.RFC3339) }
	send := func(t *testing.T, doc, field string, in map[string]any) (*gqlResponse, leasePayload) {
		t.Helper()
		res := a.post(t, tok, doc, map[string]any{"in": in})
		var p leasePayload
		decode(t, res.Data[field], &p)
		return res, p
	}
	refused := func(t *testing.T, doc, field string, in map[string]any, want fieldCode) {
		t.Helper()
		before := redistest.State(t, a.rdb)
		res, p := send(t, doc, field, in)
		wantUserErrors(t, res, payload{UserErrors: p.UserErrors}, want)
		if !maps.Equal(before, redistest.State(t, a.rdb)) {
			t.Error("a refused lease changed Redis")
		}
	}

	refused(t, leaseFields, "createInstance", with("past", map[string]any{"expiresAt": at(-time.Minute)}), fc("UNPROCESSABLE", "input", "expiresAt"))
	refused(t, leaseFields, "createInstance", with("far", map[string]any{"expiresAt": at(11 * 365 * 24 * time.Hour)}), fc("BAD_USER_INPUT", "input", "expiresAt"))
	refused(t, leaseFields, "createInstance", with("no-lease", map[string]any{"expiryAction": "DELETE"}), fc("UNPROCESSABLE", "input", "expiryAction"))

	end := at(time.Hour)
	res, p := send(t, leaseFields, "createInstance", with("leased", map[string]any{"expiresAt": end}))
	if p.Instance == nil || p.Instance.ExpiresAt == nil || *p.Instance.ExpiresAt != end || p.Instance.ExpiryAction == nil || *p.Instance.ExpiryAction != "STOP" {
		t.Fatalf("a lease of an hour: %s, want it with STOP", res.Raw)
	}
	id := p.Instance.ID

	later := at(2 * time.Hour)
	if res, p := send(t, leaseUpdate, "updateInstance", map[string]any{"id": id, "expiresAt": later, "expiryAction": "DELETE"}); p.Instance == nil ||
		*p.Instance.ExpiresAt != later || *p.Instance.ExpiryAction != "DELETE" {
		t.Errorf("extending the lease and changing its action: %s", res.Raw)
	}
	refused(t, leaseUpdate, "updateInstance", map[string]any{"id": id, "expiresAt": at(-time.Second)}, fc("UNPROCESSABLE", "input", "expiresAt"))
	if res, p := send(t, leaseUpdate, "updateInstance", map[string]any{"id": id, "expiresAt": nil}); p.Instance == nil ||
		p.Instance.ExpiresAt != nil || p.Instance.ExpiryAction != nil {
		t.Errorf("ending the lease: %s, want no lease and no action", res.Raw)
	}
	refused(t, leaseUpdate, "updateInstance", map[string]any{"id": id, "expiryAction": "STOP"}, fc("UNPROCESSABLE", "input", "expiryAction"))
}
