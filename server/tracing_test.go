package server

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/telemetry"
	"github.com/computeql/computeql/worker"
)

// traceLimit bounds the waits for the workers' spans; it never judges a timing.
const traceLimit = 15 * time.Second

// clientTraceparent is what a traced client sends; its span is the request's parent.
const clientTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// createAs sends createInstance with a W3C traceparent header and returns the instance's id.
func (a *api) createAs(t *testing.T, token, name string) string {
	t.Helper()
	req := postRequest(t, createMutation, map[string]any{"input": createInput(name)})
	req.Header.Set("traceparent", clientTraceparent)
	res := a.send(t, token, req)
	if res.Status != http.StatusOK || len(res.Errors) > 0 {
		t.Fatalf("create: status %d, %s", res.Status, res.Raw)
	}
	var out struct {
		Instance struct{ ID string }
	}
	decode(t, res.Data["createInstance"], &out)
	return out.Instance.ID
}

// One trace runs from the client's request through the GraphQL operation and the queue to the
// reconcile and the region call it made; later runs the queue starts by itself are traces of
// their own.
func TestCreateInstanceIsOneTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	shutdown, err := telemetry.Setup(context.Background(), telemetry.Config{Exporter: exp, Role: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	a := newAPI(t)
	traced, err := region.Instrument(a.region, telemetry.TracerProvider(), nil)
	if err != nil {
		t.Fatal(err)
	}
	a.runWorkers(t, func(o *worker.Options) { o.Region = traced })

	id := a.createAs(t, a.admin(t), "traced")
	key := attribute.String("queue.key", "acme/"+id)
	var spans tracetest.SpanStubs
	eventually.Holds(t, traceLimit, func() bool {
		spans = exp.GetSpans()
		// The operation's span ends after its answer is written, and so may reach the exporter
		// after the worker's first spans.
		return len(withName(spans, "region.CreateServer")) == 1 && len(withAttr(withName(spans, "queue.handle"), key)) >= 2 &&
			len(withName(spans, "mutation")) == 1
	}, "the create's region call, a second run of the instance and the operation's span")

	byID := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range spans {
		byID[s.SpanContext.SpanID()] = s
	}
	// The region call and its recorded ancestors, innermost first.
	var chain tracetest.SpanStubs
	var names []string
	for s, ok := withName(spans, "region.CreateServer")[0], true; ok; s, ok = byID[s.Parent.SpanID()] {
		chain, names = append(chain, s), append(names, s.Name)
	}
	if want := []string{"region.CreateServer", "reconcile", "queue.handle", "mutation"}; !slices.Equal(names, want) {
		t.Fatalf("CreateServer's ancestry = %v, want %v", names, want)
	}
	create, rec, op := chain[0], chain[1], chain[3]
	if op.SpanKind != trace.SpanKindServer || !slices.Contains(op.Attributes, attribute.String("graphql.operation.type", "mutation")) {
		t.Errorf("operation span = %s %v, want a server span of a mutation", op.SpanKind, op.Attributes)
	}
	if got := op.Parent; got.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || got.SpanID().String() != "b7ad6b7169203331" || !got.IsRemote() {
		t.Errorf("operation span's parent = %s/%s, want the client's from traceparent", got.TraceID(), got.SpanID())
	}
	if create.SpanContext.TraceID() != op.SpanContext.TraceID() {
		t.Errorf("CreateServer is in trace %s, the operation in %s", create.SpanContext.TraceID(), op.SpanContext.TraceID())
	}
	if !slices.Contains(rec.Attributes, attribute.String("instance.id", id)) || !slices.Contains(rec.Attributes, attribute.String("reconcile.outcome", "poll")) {
		t.Errorf("reconcile attributes = %v, want instance.id=%s and reconcile.outcome=poll (the server is building)", rec.Attributes, id)
	}

	for _, run := range withAttr(withName(spans, "queue.handle"), key) {
		if run.SpanContext.TraceID() == op.SpanContext.TraceID() {
			continue
		}
		if run.Parent.IsValid() {
			t.Errorf("a run the queue started by itself has parent %s, want a root", run.Parent.SpanID())
		}
	}
}

// Tracing stays off unless telemetry.Setup turned it on, even when something else installed
// OpenTelemetry globals: no span is made, and a caller's traceparent goes no further than the
// HTTP request, so queue messages hold the key alone.
func TestTracingOffRecordsAndCarriesNothing(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTracerProvider(prevTP); otel.SetTextMapPropagator(prevProp) })
	if telemetry.TracerProvider() != nil {
		t.Fatal("tracing is on before the test")
	}
	a := newAPI(t)
	id := a.createAs(t, a.admin(t), "untraced")

	ctx := context.Background()
	keys, err := a.rdb.Keys(ctx, "cq:{q*}:s").Result()
	if err != nil {
		t.Fatal(err)
	}
	messages := 0
	for _, k := range keys {
		entries, err := a.rdb.XRange(ctx, k, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			messages++
			if len(e.Values) != 1 || e.Values["k"] != "acme/"+id {
				t.Errorf("message fields = %v, want the key alone", e.Values)
			}
		}
	}
	if messages != 1 {
		t.Fatalf("%d messages queued, want the create's one", messages)
	}

	a.runWorkers(t)
	eventually.Holds(t, traceLimit, func() bool { return a.provisioning(t, id) == "PROVISIONED" }, "instance %s provisioned", id)
	if spans := rec.Started(); len(spans) != 0 {
		t.Errorf("%d spans started with tracing off, the first %s", len(spans), spans[0].Name())
	}
}

// provisioning reads an instance's provisioning status.
func (a *api) provisioning(t *testing.T, id string) string {
	t.Helper()
	res := a.mustPost(t, a.admin(t), `query($id: ID!) { instance(id: $id) { status { provisioningStatus } } }`, map[string]any{"id": id})
	var out struct {
		Instance struct {
			Status struct{ ProvisioningStatus string }
		}
	}
	decode(t, res.Data, &out)
	return out.Instance.Status.ProvisioningStatus
}

func withName(spans tracetest.SpanStubs, name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func withAttr(spans tracetest.SpanStubs, kv attribute.KeyValue) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans {
		if slices.Contains(s.Attributes, kv) {
			out = append(out, s)
		}
	}
	return out
}
