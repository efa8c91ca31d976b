package server

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestNotYetImplementedOperationsAreUnavailable: every operation a later part of computeql
// implements answers at once with one top-level UNAVAILABLE error naming it, HTTP 200, never a
// panic, a hang or an internal error, and writes nothing. The subscription, sent as a plain
// POST, gets the same clear error rather than a stream that never ends.
func TestNotYetImplementedOperationsAreUnavailable(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	inst := a.mustCreate(t, tok, createInput("target"))
	vars := map[string]any{"id": inst.ID}

	tests := []struct {
		op       string
		document string
		dataNull bool // the field is non-null, so the error nulls the whole data
	}{
		{"startInstance", `mutation($id: ID!) { startInstance(input: {id: $id}) { instance { id } userErrors { code } } }`, true},
		{"stopInstance", `mutation($id: ID!) { stopInstance(input: {id: $id}) { instance { id } userErrors { code } } }`, true},
		{"rebootInstance", `mutation($id: ID!) { rebootInstance(input: {id: $id, hard: true}) { instance { id } userErrors { code } } }`, true},
		{"createConsoleSession", `mutation($id: ID!) { createConsoleSession(input: {id: $id}) { consoleSession { url expiresAt } userErrors { code } } }`, true},
		{"snapshotInstance", `mutation($id: ID!) { snapshotInstance(input: {id: $id, name: "snap", tags: [{name: "a", value: "b"}]}) { image { id } userErrors { code } } }`, true},
		{"instanceSSHKey", `query($id: ID!) { instanceSSHKey(id: $id) { privateKey } }`, true},
	}
	for _, tt := range tests {
		t.Run(tt.op, func(t *testing.T) {
			before := a.storeState(t)
			req := postRequest(t, tt.document, vars)
			req.Header.Set("Authorization", "Bearer "+tok)
			res := decodeResponse(t, within(t, 10*time.Second, func() *httptest.ResponseRecorder { return a.serve(req) }))
			wantError(t, res, http.StatusOK, "UNAVAILABLE")
			if len(res.Errors) != 1 {
				return
			}
			field := strings.Fields(tt.op)[0]
			if !reflect.DeepEqual(res.Errors[0].Path, []any{field}) {
				t.Errorf("error path = %v, want [%s]", res.Errors[0].Path, field)
			}
			if msg := res.Errors[0].Message; !strings.Contains(msg, field) || !strings.Contains(msg, "not available") {
				t.Errorf("message %q does not say that %s is not available", msg, field)
			}
			if tt.dataNull && res.Data != nil {
				t.Errorf("data = %v, want null", res.Data)
			}
			if !reflect.DeepEqual(before, a.storeState(t)) {
				t.Error("an unavailable operation changed Redis")
			}
		})
	}

	// Several unavailable fields in one query: one error each, at their own paths.
	res := a.post(t, tok, `query($id: ID!) { me { subject } instanceSSHKey(id: $id) { privateKey } }`, vars)
	if res.Status != http.StatusOK || len(res.Errors) != 1 || res.codes()[0] != "UNAVAILABLE" {
		t.Errorf("mixed query: %s", res.Raw)
	}
}

// TestSubscriptionOverGETIsRefused: GET carries only queries; a subscription over GET is
// refused at once with 406 instead of hanging.
func TestSubscriptionOverGETIsRefused(t *testing.T) {
	a := newAPI(t)
	res := a.get(t, a.admin(t), `subscription { instanceEvents(organizationId: "acme") { cursor } }`, nil)
	if res.Status != http.StatusNotAcceptable || len(res.Errors) != 1 {
		t.Errorf("status %d: %s", res.Status, res.Raw)
	}
}

// within runs f and fails the test if it does not return in d, so that an operation that
// hangs (e.g. a subscription streaming over a one-shot transport) fails instead of stalling
// the suite. Nothing waits on the timer when f returns at once. f must not call tb.
func within[T any](tb testing.TB, d time.Duration, f func() T) T {
	tb.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(d):
		tb.Fatalf("no answer within %s", d)
		panic("unreachable")
	}
}
