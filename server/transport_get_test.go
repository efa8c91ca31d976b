package server

import (
	"net/http"
	"testing"
	"time"
)

// TestSubscriptionOverGETIsRefused: GET carries only queries; a subscription over GET is
// refused at once with GRAPHQL_VALIDATION_FAILED instead of hanging (gqlgen alone
// answers 406 without a code).
func TestSubscriptionOverGETIsRefused(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	res := a.get(t, tok, `subscription { instanceEvents(organizationId: "acme") { cursor } }`, nil)
	wantError(t, res, http.StatusOK, "GRAPHQL_VALIDATION_FAILED")
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
