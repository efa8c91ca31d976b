package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/computeql/computeql/redisproc"
	"github.com/computeql/computeql/redistest"
)

// BenchmarkCreateHTTP measures createInstance through the whole HTTP handler (authentication,
// body limit, gqlgen parse/validate/execute, domain rules, one Redis script, queue append)
// against the real redis-server, with b.RunParallel clients (-cpu sets GOMAXPROCS; use
// -test.parallelism-style scaling through SetParallelism for more concurrent clients).
func BenchmarkCreateHTTP(b *testing.B) {
	a := newAPI(b, func(o *Options) { o.RateLimit = -1 }) // one principal floods on purpose
	admin := a.admin(b)
	// Quota must never be what refuses in a benchmark.
	res := a.post(b, admin, `mutation { setQuota(input: {organizationId: "acme", limits: [
		{kind: "servers", limit: 1000000000}, {kind: "cpus", limit: 1000000000},
		{kind: "memoryGiB", limit: 1000000000}]}) { userErrors { message } } }`, nil)
	if len(res.Errors) > 0 {
		b.Fatal(res.Errors)
	}
	member := a.admin(b)
	var n atomic.Int64
	calls := &redistest.RoundTrips{}
	a.rdb.AddHook(calls)
	b.SetParallelism(32) // 32 × GOMAXPROCS concurrent clients: 64 on this 2-core machine
	cpu0, err := redisproc.CPU(b.Context(), a.rdb)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body, _ := json.Marshal(map[string]any{"query": createMutation, "variables": map[string]any{"input": createInput(fmt.Sprint("b-", n.Add(1)))}})
			req := httptest.NewRequest(http.MethodPost, "/graphql", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+member)
			rec := httptest.NewRecorder()
			a.handler.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK || bytes.Contains(rec.Body.Bytes(), []byte(`"code"`)) {
				b.Fatalf("create failed: %d %s", rec.Code, rec.Body.String())
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "creates/s")
	b.ReportMetric(float64(calls.N())/float64(b.N), "redis-roundtrips/op")
	cpu1, err := redisproc.CPU(b.Context(), a.rdb)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "redis-cpu-µs/op")
}
