package server

import (
	"context"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/ast"
)

// opMetrics counts GraphQL operations by what they ask and outcome and times them. The
// outcome is "ok" or the code of the first error, so alerts can tell refused input from
// internal failures. An operation is labelled by its type and its first top-level field
// ("mutation:createInstance"), never by the name its client gave it: names are the clients'
// choice, and a client inventing names would add series to every scrape, and to this
// process's memory, without end; the schema's fields are a bounded set.
type opMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

var _ interface {
	graphql.HandlerExtension
	graphql.ResponseInterceptor
} = (*opMetrics)(nil)

func newOpMetrics(reg prometheus.Registerer) (*opMetrics, error) {
	m := &opMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "computeql_graphql_operations_total",
			Help: "GraphQL operations by type and first top-level field, and outcome (ok or the first error's code).",
		}, []string{"operation", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "computeql_graphql_operation_duration_seconds",
			Help:    "Time to answer a GraphQL operation, by type and first top-level field.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"operation"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (*opMetrics) ExtensionName() string                   { return "OperationMetrics" }
func (*opMetrics) Validate(graphql.ExecutableSchema) error { return nil }

func (m *opMetrics) InterceptResponse(ctx context.Context, next graphql.ResponseHandler) *graphql.Response {
	start := time.Now()
	res := next(ctx)
	op, logged := "unknown", "unknown"
	if graphql.HasOperationContext(ctx) {
		if oc := graphql.GetOperationContext(ctx); oc.Operation != nil {
			op = string(oc.Operation.Operation) + ":" + firstField(oc.Operation.SelectionSet)
			// The request log shows the client's own name, which helps find its code; a log
			// line costs nothing after it is written.
			logged = string(oc.Operation.Operation)
			if name := oc.Operation.Name; name != "" && len(name) <= 64 {
				logged += ":" + name
			}
		}
	}
	outcome := "ok"
	if res != nil && len(res.Errors) > 0 {
		outcome = "error"
		if code, ok := res.Errors[0].Extensions["code"].(string); ok {
			outcome = code
		}
	}
	if !onSocket(ctx) {
		requestInfoFrom(ctx).set("", logged)
	}
	m.requests.WithLabelValues(op, outcome).Inc()
	m.duration.WithLabelValues(op).Observe(time.Since(start).Seconds())
	return res
}

// firstField is the schema name (not the alias) of the first top-level field of a validated
// operation, looking into fragments; "other" when there is none.
func firstField(set ast.SelectionSet) string {
	for _, sel := range set {
		switch s := sel.(type) {
		case *ast.Field:
			if s.Definition != nil {
				return s.Definition.Name
			}
		case *ast.InlineFragment:
			if name := firstField(s.SelectionSet); name != "other" {
				return name
			}
		case *ast.FragmentSpread:
			if s.Definition != nil {
				if name := firstField(s.Definition.SelectionSet); name != "other" {
					return name
				}
			}
		}
	}
	return "other"
}
