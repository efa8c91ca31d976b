package server

import (
	"context"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/computeql/computeql/telemetry"
)

// tracing gives every GraphQL operation a server span, named by its type and, when the client
// named it, its name ("mutation CreateWeb"). The span is the parent of everything the
// operation causes: the domain's writes, and through the queue message the reconcile and its
// region calls. A caller's W3C traceparent header makes it a child of the caller's span.
//
// A query's or mutation's span ends with its response. A subscription's covers its start, up
// to its first message: one span for a stream that may last hours would say nothing useful.
// Operations refused before they run (unparsable, invalid, over a limit, rate limited) get no
// span; the operation metrics count them.
type tracing struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
}

var _ interface {
	graphql.HandlerExtension
	graphql.OperationInterceptor
} = tracing{}

// useTracing adds the extension when telemetry.Setup turned tracing on, and nothing otherwise:
// gqlgen wraps every operation interceptor in a closure per operation, an allocation even for
// one that would only pass the operation on.
func useTracing(gql *handler.Server) {
	if tp := telemetry.TracerProvider(); tp != nil {
		gql.Use(tracing{tracer: tp.Tracer("github.com/computeql/computeql/server"), propagator: otel.GetTextMapPropagator()})
	}
}

func (tracing) ExtensionName() string                   { return "Tracing" }
func (tracing) Validate(graphql.ExecutableSchema) error { return nil }

// maxSpanOpName bounds the client-chosen part of a span name, as the operation metrics bound
// their label.
const maxSpanOpName = 64

func (t tracing) InterceptOperation(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
	oc := graphql.GetOperationContext(ctx)
	ctx = t.propagator.Extract(ctx, propagation.HeaderCarrier(oc.Headers))
	typ, name := "operation", ""
	if oc.Operation != nil {
		typ, name = string(oc.Operation.Operation), oc.Operation.Name
	}
	spanName := typ
	if name != "" && len(name) <= maxSpanOpName {
		spanName += " " + name
	}
	ctx, span := t.tracer.Start(ctx, spanName, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("graphql.operation.type", typ)))
	if name != "" {
		span.SetAttributes(attribute.String("graphql.operation.name", name))
	}
	// The executor runs the operation in the context handed on here: resolvers see the span.
	responses := next(ctx)
	ended := false
	return func(ctx context.Context) *graphql.Response {
		res := responses(ctx)
		if !ended {
			ended = true
			endOperationSpan(span, res)
		}
		return res
	}
}

// endOperationSpan marks the span failed when the response carries top-level errors, with the
// first one's code; userErrors in a payload are answers, not failures.
func endOperationSpan(span trace.Span, res *graphql.Response) {
	if res != nil && len(res.Errors) > 0 {
		code, _ := res.Errors[0].Extensions["code"].(string)
		if code != "" {
			span.SetAttributes(attribute.String("graphql.error.code", code))
		}
		span.SetStatus(codes.Error, res.Errors[0].Message)
	}
	span.End()
}
