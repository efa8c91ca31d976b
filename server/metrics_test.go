package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestMetricsCountOperationsByNameAndOutcome(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	a.post(t, tok, `query Me { me { subject } }`, nil)
	a.post(t, tok, `query Me { me { subject } }`, nil)
	a.post(t, tok, `{ instance(id: "nope") { id } }`, nil)
	a.post(t, tok, `mutation { startInstance(input: {id: "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f"}) { userErrors { code } } }`, nil)

	rec := httptest.NewRecorder()
	a.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`computeql_graphql_operations_total{operation="query:Me",outcome="ok"} 2`,
		`computeql_graphql_operations_total{operation="query",outcome="BAD_USER_INPUT"} 1`,
		`computeql_graphql_operations_total{operation="mutation",outcome="NOT_FOUND"} 1`,
		`computeql_graphql_operation_duration_seconds_count{operation="query:Me"} 2`,
		`go_goroutines`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
