package telemetry

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// collector is an OTLP/HTTP endpoint on loopback that keeps what it was sent.
type collector struct {
	*httptest.Server
	mu       sync.Mutex
	requests []request
}

type request struct {
	path, contentType string
	body              []byte
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.requests = append(c.requests, request{r.URL.Path, r.Header.Get("Content-Type"), body})
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *collector) received() []request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]request(nil), c.requests...)
}

// Spans reach the collector's traces path over OTLP/HTTP, with the process's name and role,
// at the latest when shutdown flushes them; Setup itself sends nothing.
func TestSpansExportedToEndpoint(t *testing.T) {
	cases := []struct {
		name, path, wantPath string
	}{
		{"base URL", "", "/v1/traces"},
		{"base URL with slash", "/", "/v1/traces"},
		{"base URL under a prefix", "/otel/", "/otel/v1/traces"},
		{"full traces URL", "/custom/v1/traces", "/custom/v1/traces"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCollector(t)
			shutdown, err := Setup(context.Background(), Config{Endpoint: c.URL + tc.path, Role: "worker"})
			if err != nil {
				t.Fatal(err)
			}
			if TracerProvider() == nil {
				t.Fatal("TracerProvider is nil after Setup")
			}
			if n := len(c.received()); n != 0 {
				t.Errorf("Setup sent %d requests; it must not contact the collector", n)
			}
			_, span := TracerProvider().Tracer("test").Start(context.Background(), "probe-span")
			span.End()
			if err := shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if TracerProvider() != nil {
				t.Error("TracerProvider is still set after shutdown")
			}
			reqs := c.received()
			if len(reqs) != 1 {
				t.Fatalf("collector got %d requests, want 1", len(reqs))
			}
			r := reqs[0]
			if r.path != tc.wantPath || r.contentType != "application/x-protobuf" {
				t.Errorf("request to %s (%s), want %s (application/x-protobuf)", r.path, r.contentType, tc.wantPath)
			}
			for _, want := range []string{"probe-span", "service.name", "computeql", "computeql.role", "worker"} {
				if !bytes.Contains(r.body, []byte(want)) {
					t.Errorf("export lacks %q", want)
				}
			}
		})
	}
}

// Without an endpoint nothing is installed: parts that trace see a nil provider and the
// OpenTelemetry globals are left alone.
func TestOffByDefault(t *testing.T) {
	prop := otel.GetTextMapPropagator()
	shutdown, err := Setup(context.Background(), Config{Role: "api"})
	if err != nil {
		t.Fatal(err)
	}
	if TracerProvider() != nil {
		t.Error("TracerProvider is set without an endpoint")
	}
	if otel.GetTextMapPropagator() != prop {
		t.Errorf("global propagator changed to %T", otel.GetTextMapPropagator())
	}
	if err := shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

// While tracing is on, W3C trace context is the global propagator; shutdown puts the old one
// back.
func TestPropagatorInstalledAndRestored(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	shutdown, err := Setup(context.Background(), Config{Exporter: tracetest.NewInMemoryExporter()})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := otel.GetTextMapPropagator().(propagation.TraceContext); !ok {
		t.Errorf("global propagator = %T, want propagation.TraceContext", otel.GetTextMapPropagator())
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if otel.GetTextMapPropagator() != prev {
		t.Error("shutdown did not restore the previous propagator")
	}
}

func TestSetupRefuses(t *testing.T) {
	cases := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"host:port without a scheme", Config{Endpoint: "otel-collector:4318"}, "not an http(s) URL"},
		{"other scheme", Config{Endpoint: "grpc://otel-collector:4317"}, "not an http(s) URL"},
		{"no host", Config{Endpoint: "http:///v1/traces"}, "not an http(s) URL"},
		{"sample ratio above 1", Config{Endpoint: "http://127.0.0.1:4318", SampleRatio: 1.5}, "sample ratio"},
		{"negative sample ratio", Config{Endpoint: "http://127.0.0.1:4318", SampleRatio: -0.1}, "sample ratio"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			shutdown, err := Setup(context.Background(), tc.cfg)
			if err == nil {
				shutdown(context.Background())
				t.Fatalf("Setup(%+v) succeeded", tc.cfg)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not say %q", err, tc.wantErr)
			}
			if TracerProvider() != nil {
				t.Error("a refused setup left a provider installed")
			}
		})
	}
}

func TestOneSetupAtATime(t *testing.T) {
	shutdown, err := Setup(context.Background(), Config{Exporter: tracetest.NewInMemoryExporter()})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(context.Background())
	if second, err := Setup(context.Background(), Config{Exporter: tracetest.NewInMemoryExporter()}); err == nil {
		second(context.Background())
		t.Fatal("a second Setup succeeded while the first was active")
	}
}

// SampleRatio thins the traces this process begins, while a trace begun elsewhere keeps its
// caller's decision, so that no trace loses its middle.
func TestSampleRatioAppliesToRootsOnly(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	shutdown, err := Setup(context.Background(), Config{Exporter: exp, SampleRatio: 1e-12})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(context.Background())
	tracer := TracerProvider().Tracer("test")
	_, root := tracer.Start(context.Background(), "root")
	root.End()
	caller := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	_, child := tracer.Start(trace.ContextWithRemoteSpanContext(context.Background(), caller), "child")
	child.End()
	spans := exp.GetSpans()
	if len(spans) != 1 || spans[0].Name != "child" {
		t.Errorf("exported %d spans, want the sampled caller's child alone", len(spans))
	}
}
