package queue

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/computeql/computeql/eventually"
)

// adderSpan is the span context of a request that enqueues, as a remote caller's would be.
var adderSpan = trace.NewSpanContext(trace.SpanContextConfig{
	TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
	SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
	TraceFlags: trace.FlagsSampled,
	TraceState: must(trace.ParseTraceState("vendor=v1")),
})

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// The trace context of the enqueueing request travels in the stream entry and becomes the
// parent of the run; a message without one (as older processes wrote them) runs in a trace of
// its own, and a consumer without a tracer still hands the carried context to its handler.
func TestMessageCarriesTraceContext(t *testing.T) {
	cases := []struct {
		name       string
		ctx        context.Context
		traced     bool // the consumer has a tracer provider
		wantFields map[string]any
	}{{
		name:   "request's context becomes the run's parent",
		ctx:    trace.ContextWithSpanContext(context.Background(), adderSpan),
		traced: true,
		wantFields: map[string]any{"k": "k1",
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "vendor=v1"},
	}, {
		name:       "message without context gets a root span",
		ctx:        context.Background(),
		traced:     true,
		wantFields: map[string]any{"k": "k1"},
	}, {
		name:   "untraced consumer passes the context on",
		ctx:    trace.ContextWithSpanContext(context.Background(), adderSpan),
		traced: false,
		wantFields: map[string]any{"k": "k1",
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "vendor=v1"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rdb, q := newTestQueue(t, Options{Shards: 2, Propagator: propagation.TraceContext{}})
			if err := q.Enqueue(tc.ctx, "k1"); err != nil {
				t.Fatal(err)
			}
			entries, err := rdb.XRange(context.Background(), streamKey(q.Shard("k1")), "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 1 || !maps.Equal(entries[0].Values, tc.wantFields) {
				t.Fatalf("stream entries = %v, want one with fields %v", entries, tc.wantFields)
			}

			rec := tracetest.NewSpanRecorder()
			opts := ConsumerOptions{}
			if tc.traced {
				opts.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			}
			seen := make(chan trace.SpanContext, 1)
			startConsumer(t, q, HandlerFunc(func(ctx context.Context, _ Task) (time.Duration, error) {
				seen <- trace.SpanContextFromContext(ctx)
				return 0, nil
			}), opts)
			got := waitFor(t, seen, "the run")
			waitIdle(t, q, "k1")

			carried := tc.wantFields["traceparent"] != nil
			if !tc.traced {
				if !got.Equal(adderSpan.WithRemote(true)) {
					t.Errorf("handler's span context = %+v, want the carried %+v", got, adderSpan)
				}
				return
			}
			eventually.Holds(t, waitLimit, func() bool { return len(rec.Ended()) == 1 }, "one queue.handle span ended")
			span := rec.Ended()[0]
			if span.Name() != "queue.handle" || span.SpanKind() != trace.SpanKindConsumer {
				t.Errorf("span = %s (%s), want queue.handle (consumer)", span.Name(), span.SpanKind())
			}
			if !got.Equal(span.SpanContext()) {
				t.Errorf("handler runs in span %s, want queue.handle's %s", got.SpanID(), span.SpanContext().SpanID())
			}
			if carried {
				if span.Parent().SpanID() != adderSpan.SpanID() || span.SpanContext().TraceID() != adderSpan.TraceID() {
					t.Errorf("queue.handle parent = %s in trace %s, want %s in %s",
						span.Parent().SpanID(), span.SpanContext().TraceID(), adderSpan.SpanID(), adderSpan.TraceID())
				}
			} else if span.Parent().IsValid() || span.SpanContext().TraceID() == adderSpan.TraceID() {
				t.Errorf("queue.handle of a message without context has parent %+v, want a new root", span.Parent())
			}
			wantAttrs(t, span.Attributes(), attribute.String("queue.key", "k1"), attribute.String("queue.outcome", "ok"),
				attribute.Int("queue.attempt", 1))
		})
	}
}

// An Addition carries the adder's trace context as Enqueue does: another package's script
// stores it with the message.
func TestAdditionCarriesTraceContext(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: 2, Propagator: propagation.TraceContext{}})
	ctx := trace.ContextWithSpanContext(context.Background(), adderSpan)
	if err := runAddition(ctx, rdb, q, "k1").Err(); err != nil {
		t.Fatal(err)
	}
	entries, err := rdb.XRange(ctx, streamKey(q.Shard("k1")), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"k": "k1",
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "vendor=v1"}
	if len(entries) != 1 || !maps.Equal(entries[0].Values, want) {
		t.Fatalf("stream entries = %v, want one with fields %v", entries, want)
	}
}

// The span says how the run ended: a failing handler is retried and the span carries its
// error; the retry, which the queue schedules by itself, is a new trace.
func TestHandleSpanRecordsFailureAndRetryStartsNewTrace(t *testing.T) {
	_, q := newTestQueue(t, Options{Shards: 2, Propagator: propagation.TraceContext{}})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	boom := errors.New("region unavailable")
	var runs atomic.Int32
	startConsumer(t, q, HandlerFunc(func(context.Context, Task) (time.Duration, error) {
		if runs.Add(1) == 1 {
			return 0, boom
		}
		return 0, nil
	}), ConsumerOptions{TracerProvider: tp})
	if err := q.Enqueue(trace.ContextWithSpanContext(context.Background(), adderSpan), "k1"); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, waitLimit, func() bool { return len(rec.Ended()) == 2 }, "two runs ended")
	spans := rec.Ended()
	first, retry := spans[0], spans[1]
	if first.Status().Code != codes.Error || first.Status().Description != boom.Error() {
		t.Errorf("failed run's status = %+v, want the handler's error", first.Status())
	}
	wantAttrs(t, first.Attributes(), attribute.String("queue.outcome", "retried"), attribute.Int("queue.attempt", 1))
	wantAttrs(t, retry.Attributes(), attribute.String("queue.outcome", "ok"), attribute.Int("queue.attempt", 2))
	if first.Parent().SpanID() != adderSpan.SpanID() {
		t.Errorf("first run's parent = %s, want the adder's %s", first.Parent().SpanID(), adderSpan.SpanID())
	}
	if retry.Parent().IsValid() || retry.SpanContext().TraceID() == adderSpan.TraceID() {
		t.Errorf("retry's parent = %+v in trace %s, want the root of a new trace", retry.Parent(), retry.SpanContext().TraceID())
	}
}

// wantAttrs checks that attrs hold each of want.
func wantAttrs(t *testing.T, attrs []attribute.KeyValue, want ...attribute.KeyValue) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(attrs, w) {
			t.Errorf("attribute %s=%s missing from %v", w.Key, w.Value.Emit(), attrs)
		}
	}
}
