package queue

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// A message carries its adder's trace context as extra fields of its stream entry, named as
// the propagator names them (W3C: traceparent, tracestate). Messages without them, such as
// those older processes wrote, are handled alike, in a trace of their own.

// keyField is the stream-entry field holding the key.
const keyField = "k"

// traceFields returns the trace context of ctx's span as field/value pairs for a new
// message. A context without a span costs nothing more: no propagator runs and the message
// holds only the key.
func (q *Queue) traceFields(ctx context.Context) []any {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	// A variable of its own: the carrier escapes to the heap, and only here.
	var carrier argsCarrier
	q.opts.Propagator.Inject(ctx, &carrier)
	return carrier
}

// argsCarrier collects injected fields as script arguments.
type argsCarrier []any

// Set appends the field, unless it would shadow the key's own.
func (c *argsCarrier) Set(field, value string) {
	if field != keyField {
		*c = append(*c, field, value)
	}
}

func (c *argsCarrier) Get(string) string { return "" }
func (c *argsCarrier) Keys() []string    { return nil }

// entryCarrier reads a stream entry's fields for extraction.
type entryCarrier map[string]any

func (c entryCarrier) Get(field string) string { s, _ := c[field].(string); return s }
func (c entryCarrier) Set(string, string)      {}
func (c entryCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// joinTrace returns ctx with the trace context the message carries, if any.
func (c *Consumer) joinTrace(ctx context.Context, m message) context.Context {
	if len(m.fields) <= 1 {
		return ctx // the key alone
	}
	return c.q.opts.Propagator.Extract(ctx, entryCarrier(m.fields))
}

// traceRun starts the queue.handle span of a run, a child of the context the message carries
// (the request that added the key) or else the root of a new trace. A child rather than a
// link: the run is the request's consequence, and one trace then shows the request through to
// the region calls its reconcile made, sampled as one. The span starts when its message's
// batch was begun and ends when the returned func is told how the run ended, once its
// outcome is recorded; that func also releases the message.
func (c *Consumer) traceRun(ctx context.Context, j job) (context.Context, func(runResult)) {
	m := j.m
	ctx, span := c.tracer.Start(ctx, "queue.handle", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(j.begun),
		trace.WithAttributes(attribute.String("queue.key", m.key), attribute.Int("queue.shard", m.shard),
			attribute.String("queue.message_id", m.id)))
	return ctx, func(r runResult) {
		span.SetAttributes(attribute.String("queue.outcome", r.outcome))
		if r.task.Attempt > 0 {
			span.SetAttributes(attribute.Int("queue.attempt", r.task.Attempt), attribute.Int64("queue.fence", r.task.Fence))
		}
		if r.err != nil {
			span.RecordError(r.err)
			span.SetStatus(codes.Error, r.err.Error())
		}
		span.End()
		c.release(m)
	}
}
