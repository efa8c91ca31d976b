package server

import (
	"context"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/prometheus/client_golang/prometheus"
)

// opMetrics counts GraphQL operations by name and outcome and times them. The outcome is "ok"
// or the code of the first error, so alerts can tell refused input from internal failures.
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
			Help: "GraphQL operations by operation name and outcome (ok or the first error's code).",
		}, []string{"operation", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "computeql_graphql_operation_duration_seconds",
			Help:    "Time to answer a GraphQL operation, by operation name.",
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
	// The name is the client's, so it is bounded to keep label cardinality in check.
	op := "unknown"
	if graphql.HasOperationContext(ctx) {
		if oc := graphql.GetOperationContext(ctx); oc.Operation != nil {
			op = string(oc.Operation.Operation)
			if name := oc.Operation.Name; name != "" && len(name) <= 64 {
				op += ":" + name
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
		requestInfoFrom(ctx).set("", op)
	}
	m.requests.WithLabelValues(op, outcome).Inc()
	m.duration.WithLabelValues(op).Observe(time.Since(start).Seconds())
	return res
}
