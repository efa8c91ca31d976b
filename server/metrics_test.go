package server

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestMetricsCountOperationsByFieldAndOutcome(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	a.post(t, tok, `query Me { me { subject } }`, nil)
	a.post(t, tok, `query Whoever { who: me { subject } }`, nil)
	a.post(t, tok, `{ instance(id: "nope") { id } }`, nil)
	a.post(t, tok, `mutation { startInstance(input: {id: "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f"}) { userErrors { code } } }`, nil)
	a.post(t, tok, `query F { ...Q } fragment Q on Query { flavors { id } }`, nil)

	body := scrape(t, a)
	for _, want := range []string{
		`computeql_graphql_operations_total{operation="query:me",outcome="ok"} 2`,
		`computeql_graphql_operations_total{operation="query:instance",outcome="BAD_USER_INPUT"} 1`,
		`computeql_graphql_operations_total{operation="mutation:startInstance",outcome="NOT_FOUND"} 1`,
		`computeql_graphql_operations_total{operation="query:flavors",outcome="ok"} 1`,
		`computeql_graphql_operation_duration_seconds_count{operation="query:me"} 2`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// Operation names are the clients' to choose: 300 operations named anew each time add no
// series, so a caller cannot grow every scrape (and the API's memory) without end.
func TestInventedOperationNamesAddNoSeries(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	a.post(t, tok, `query Warmup { me { subject } }`, nil)
	before := strings.Count(scrape(t, a), "\n")
	for i := range 300 {
		a.post(t, tok, fmt.Sprintf(`query Junk%d { me { subject } }`, i), nil)
	}
	after := scrape(t, a)
	if grown := strings.Count(after, "\n") - before; grown > 50 {
		t.Errorf("/metrics grew by %d lines for 300 invented operation names, want at most 50", grown)
	}
	if strings.Contains(after, "Junk") {
		t.Error("an invented operation name is a label value")
	}
}

func scrape(t *testing.T, a *api) string {
	t.Helper()
	rec := httptest.NewRecorder()
	a.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	return string(body)
}
