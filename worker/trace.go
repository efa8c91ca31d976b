package worker

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/computeql/computeql/queue"
)

// tracedHandler gives every reconcile a span, inside the queue's span of its message, so that
// the region calls it makes appear under it. It wraps the handler only while tracing is on.
type tracedHandler struct {
	next   queue.Handler
	tracer trace.Tracer
}

// Handle runs the reconcile in a "reconcile" span with the instance and how it ended:
// reconcile.outcome is ok (settled), poll (to be looked at again) or error (backing off).
func (h tracedHandler) Handle(ctx context.Context, t queue.Task) (time.Duration, error) {
	ctx, span := h.tracer.Start(ctx, "reconcile")
	defer span.End()
	if org, id, err := SplitKey(t.Key); err == nil {
		span.SetAttributes(attribute.String("instance.id", id), attribute.String("instance.organization_id", org))
	}
	again, err := h.next.Handle(ctx, t)
	outcome := "ok"
	switch {
	case err != nil:
		outcome = "error"
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	case again > 0:
		outcome = "poll"
	}
	span.SetAttributes(attribute.String("reconcile.outcome", outcome), attribute.Int("reconcile.attempt", t.Attempt))
	return again, err
}
