package worker

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/computeql/computeql/queue"
)

func TestReconcileSpan(t *testing.T) {
	boom := errors.New("find servers: region unavailable")
	cases := []struct {
		name        string
		again       time.Duration
		err         error
		wantOutcome string
	}{
		{"settled", 0, nil, "ok"},
		{"still building", time.Second, nil, "poll"},
		{"failed", 0, boom, "error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			var inner trace.SpanContext
			h := tracedHandler{tracer: tp.Tracer("test"), next: queue.HandlerFunc(func(ctx context.Context, _ queue.Task) (time.Duration, error) {
				inner = trace.SpanContextFromContext(ctx)
				return tc.again, tc.err
			})}
			again, err := h.Handle(context.Background(), queue.Task{Key: "acme/i-1", Attempt: 2})
			if again != tc.again || !errors.Is(err, tc.err) {
				t.Errorf("Handle = %v, %v; want the reconciler's %v, %v", again, err, tc.again, tc.err)
			}
			spans := rec.Ended()
			if len(spans) != 1 || spans[0].Name() != "reconcile" {
				t.Fatalf("spans %v, want one reconcile", spans)
			}
			span := spans[0]
			if !inner.Equal(span.SpanContext()) {
				t.Errorf("the reconciler ran in span %s, want reconcile's %s", inner.SpanID(), span.SpanContext().SpanID())
			}
			for _, want := range []attribute.KeyValue{
				attribute.String("instance.id", "i-1"), attribute.String("instance.organization_id", "acme"),
				attribute.String("reconcile.outcome", tc.wantOutcome), attribute.Int("reconcile.attempt", 2),
			} {
				if !slices.Contains(span.Attributes(), want) {
					t.Errorf("attribute %s=%s missing from %v", want.Key, want.Value.Emit(), span.Attributes())
				}
			}
			if failed := span.Status().Code == codes.Error; failed != (tc.err != nil) {
				t.Errorf("status %+v for error %v", span.Status(), tc.err)
			}
		})
	}
}
