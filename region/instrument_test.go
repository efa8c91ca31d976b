package region

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/computeql/computeql/metrictest"
)

// fakeClient answers the calls the tests make with err, and records the span context each
// call ran in. Other calls are not expected (the embedded nil Client panics).
type fakeClient struct {
	Client
	err  error
	seen []trace.SpanContext
}

func (f *fakeClient) note(ctx context.Context) {
	f.seen = append(f.seen, trace.SpanContextFromContext(ctx))
}

func (f *fakeClient) CreateServer(ctx context.Context, spec ServerSpec) (Server, error) {
	f.note(ctx)
	if f.err != nil {
		return Server{}, f.err
	}
	return Server{ID: "srv-1", ServerSpec: spec}, nil
}

func (f *fakeClient) StopServer(ctx context.Context, id string) (Server, error) {
	f.note(ctx)
	return Server{ID: id}, f.err
}

func (f *fakeClient) GetServer(ctx context.Context, id string) (Server, error) {
	f.note(ctx)
	return Server{ID: id}, f.err
}

func (f *fakeClient) FindServers(ctx context.Context, _ Scope, _, _ string) ([]Server, error) {
	f.note(ctx)
	return nil, f.err
}

func (f *fakeClient) DeleteImage(ctx context.Context, _, _, _ string) error {
	f.note(ctx)
	return f.err
}

func TestInstrumentRecordsEachCall(t *testing.T) {
	create := func(ctx context.Context, c Client) error {
		_, err := c.CreateServer(ctx, ServerSpec{Name: "web"})
		return err
	}
	find := func(ctx context.Context, c Client) error {
		_, err := c.FindServers(ctx, Scope{}, InstanceTag, "i-1")
		return err
	}
	stop := func(ctx context.Context, c Client) error {
		_, err := c.StopServer(ctx, "srv-2")
		return err
	}
	get := func(ctx context.Context, c Client) error {
		_, err := c.GetServer(ctx, "srv-3")
		return err
	}
	deleteImage := func(ctx context.Context, c Client) error {
		return c.DeleteImage(ctx, "o", "p", "img-1")
	}
	cases := []struct {
		name string
		op   string
		call func(ctx context.Context, c Client) error
		err  error
		// wantFailed: counted as an error and the span's status is Error.
		wantFailed  bool
		wantOutcome string
		wantServer  string
	}{{
		name: "created", op: "CreateServer",
		call: create, wantOutcome: "ok", wantServer: "srv-1",
	}, {
		name: "region unavailable", op: "CreateServer",
		call: create, err: fmt.Errorf("create: %w", ErrUnavailable),
		wantFailed: true, wantOutcome: "error",
	}, {
		name: "lookup failed", op: "FindServers",
		call: find, err: errors.New("connection reset"),
		wantFailed: true, wantOutcome: "error",
	}, {
		name: "refused is an answer", op: "StopServer",
		call: stop, err: fmt.Errorf("the server is stopped already: %w", ErrRefused),
		wantOutcome: "refused", wantServer: "srv-2",
	}, {
		name: "not found is an answer", op: "GetServer",
		call: get, err: ErrServerNotFound,
		wantOutcome: "not_found", wantServer: "srv-3",
	}, {
		name: "an unknown image is an answer", op: "DeleteImage",
		call: deleteImage, err: ErrImageNotFound,
		wantOutcome: "not_found",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fake := &fakeClient{err: tc.err}
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			reg := prometheus.NewRegistry()
			c, err := Instrument(fake, tp, reg)
			if err != nil {
				t.Fatal(err)
			}
			parentCtx, parent := tp.Tracer("test").Start(context.Background(), "reconcile")
			if err := tc.call(parentCtx, c); !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Fatalf("call returned %v, want the client's %v", err, tc.err)
			}
			parent.End()

			wantErrors := 0.0
			if tc.wantFailed {
				wantErrors = 1
			}
			for _, op := range opNames {
				calls, errs := 0.0, 0.0
				if op == tc.op {
					calls, errs = 1, wantErrors
				}
				if got := metrictest.Value(t, reg, "computeql_region_call_duration_seconds", "op", op); got != calls {
					t.Errorf("duration samples{op=%s} = %v, want %v", op, got, calls)
				}
				if got := metrictest.Value(t, reg, "computeql_region_call_errors_total", "op", op); got != errs {
					t.Errorf("errors{op=%s} = %v, want %v", op, got, errs)
				}
			}

			spans := rec.Ended()
			if len(spans) != 2 {
				t.Fatalf("%d spans ended, want the call's and its parent's", len(spans))
			}
			span := spans[0]
			if span.Name() != "region."+tc.op || span.SpanKind() != trace.SpanKindClient {
				t.Errorf("span = %s (%s), want region.%s (client)", span.Name(), span.SpanKind(), tc.op)
			}
			if span.Parent().SpanID() != parent.SpanContext().SpanID() {
				t.Errorf("span's parent = %s, want the caller's %s", span.Parent().SpanID(), parent.SpanContext().SpanID())
			}
			if len(fake.seen) != 1 || !fake.seen[0].Equal(span.SpanContext()) {
				t.Errorf("the client ran in %v, want the call's span %v", fake.seen, span.SpanContext())
			}
			if failed := span.Status().Code == codes.Error; failed != tc.wantFailed {
				t.Errorf("span status = %+v, want failed=%v", span.Status(), tc.wantFailed)
			}
			attrs := span.Attributes()
			if !slices.Contains(attrs, attribute.String("region.outcome", tc.wantOutcome)) {
				t.Errorf("attributes %v lack region.outcome=%s", attrs, tc.wantOutcome)
			}
			if tc.wantServer != "" && !slices.Contains(attrs, attribute.String("region.server_id", tc.wantServer)) {
				t.Errorf("attributes %v lack region.server_id=%s", attrs, tc.wantServer)
			}
		})
	}
}

func TestInstrumentOptionalParts(t *testing.T) {
	fake := &fakeClient{err: ErrUnavailable}
	if c, err := Instrument(fake, nil, nil); err != nil || c != Client(fake) {
		t.Errorf("with neither tracer nor registry: %v, %v; want the client itself", c, err)
	}

	reg := prometheus.NewRegistry()
	c, err := Instrument(fake, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateServer(context.Background(), ServerSpec{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("call returned %v", err)
	}
	if got := metrictest.Value(t, reg, "computeql_region_call_errors_total", "op", "CreateServer"); got != 1 {
		t.Errorf("metrics without a tracer: errors = %v, want 1", got)
	}
	if fake.seen[0].IsValid() {
		t.Errorf("without a tracer the client ran in span %v, want none", fake.seen[0])
	}

	if _, err := Instrument(fake, nil, reg); err == nil {
		t.Error("registering the metrics twice with one registry succeeded")
	}
}
