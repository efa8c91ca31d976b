package server

import (
	"maps"
	"strings"
	"testing"

	"github.com/computeql/computeql/redistest"
)

// TestDeletionProtection: an instance created or updated with deletionProtection refuses
// deleteInstance (UNPROCESSABLE on input.id, saying how to clear it, Redis unchanged) until an
// update clears it; the change is recorded like any other, naming deletionProtection.
func TestDeletionProtection(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	refused := func(t *testing.T, id string) {
		t.Helper()
		before := redistest.State(t, a.rdb)
		res, p := a.remove(t, tok, id)
		wantUserErrors(t, res, p, fc("UNPROCESSABLE", "input", "id"))
		if p.Instance != nil {
			t.Errorf("a refused delete returned the instance: %s", res.Raw)
		}
		if len(p.UserErrors) == 1 && !strings.Contains(p.UserErrors[0].Message, "deletionProtection: false") {
			t.Errorf("message %q does not say how to clear the protection", p.UserErrors[0].Message)
		}
		if after := redistest.State(t, a.rdb); !maps.Equal(before, after) {
			t.Errorf("a refused delete changed Redis")
		}
	}

	protected := a.mustCreate(t, tok, with("kept", map[string]any{"deletionProtection": true}))
	if !protected.DeletionProtection {
		t.Fatalf("created with deletionProtection: the instance says %v", protected.DeletionProtection)
	}
	refused(t, protected.ID)

	// Cleared by an update, recorded as a change of deletionProtection; then deletable.
	res, p := a.update(t, tok, map[string]any{"id": protected.ID, "deletionProtection": false})
	if len(p.UserErrors) > 0 || p.Instance == nil || p.Instance.DeletionProtection {
		t.Fatalf("clearing the protection: %s", res.Raw)
	}
	hist := a.post(t, tok, `query($id: ID!) { instanceEvents(id: $id, first: 10) { edges { node { kind changedFields } } } }`, map[string]any{"id": protected.ID})
	if !strings.Contains(string(hist.Raw), `{"kind":"UPDATED","changedFields":["deletionProtection"]}`) {
		t.Errorf("history does not record the change of deletionProtection: %s", hist.Raw)
	}
	if res, p := a.remove(t, tok, protected.ID); len(p.UserErrors) > 0 || p.Instance == nil || p.Instance.Status.ProvisioningStatus != "DEPROVISIONING" {
		t.Errorf("delete once the protection was cleared: %s", res.Raw)
	}

	// Set on an instance created without it: from then on refused too.
	plain := a.mustCreate(t, tok, createInput("plain"))
	if plain.DeletionProtection {
		t.Fatal("deletionProtection defaults to true")
	}
	if res, p := a.update(t, tok, map[string]any{"id": plain.ID, "deletionProtection": true}); len(p.UserErrors) > 0 || !p.Instance.DeletionProtection {
		t.Fatalf("setting the protection: %s", res.Raw)
	}
	refused(t, plain.ID)
}
