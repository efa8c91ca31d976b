// Package telemetry switches OpenTelemetry tracing on for a process: a tracer provider that
// exports spans over OTLP/HTTP, and W3C trace context propagation. Tracing is off unless
// Setup is given somewhere to send spans.
//
// Parts that trace take TracerProvider when they are built and do no span work at all while it
// is nil. Even a no-op span costs an allocation for the context that carries it, and the
// create path runs thousands of times a second; so off means untouched, not "no-op".
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config says where spans go and how the process names itself in them.
type Config struct {
	// Endpoint is the collector's OTLP/HTTP base URL, e.g. http://otel-collector:4318; spans
	// are sent to its /v1/traces (a URL whose path already ends so is used as it is). https
	// URLs use TLS. Empty: tracing is off. Headers, certificates, timeouts and compression
	// come from the standard OTEL_EXPORTER_OTLP_* environment variables.
	Endpoint string
	// ServiceName is the service.name resource attribute. Defaults to "computeql".
	ServiceName string
	// Role is the process's role (all, api, worker, region), the computeql.role resource
	// attribute, so one service's spans can be told apart by process kind.
	Role string
	// SampleRatio is the fraction of the traces this process begins that are recorded, in
	// (0, 1]. A trace that arrives with a caller's context (an HTTP traceparent header, a
	// queue message) keeps the decision taken where it began, so a trace is whole or absent.
	// Zero leaves sampling to OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, whose default
	// records every trace.
	SampleRatio float64
	// Exporter, when set, replaces the OTLP exporter and Endpoint is ignored. Spans reach it
	// synchronously as each ends, which suits tests (tracetest.InMemoryExporter), not a
	// production collector.
	Exporter sdktrace.SpanExporter
	// Logger receives export failures. Defaults to slog.Default().
	Logger *slog.Logger
}

// shutdownTimeout bounds the final flush: a collector that is down must not hold the
// process's exit up for the exporter's whole retry schedule.
const shutdownTimeout = 5 * time.Second

var (
	mu       sync.Mutex
	provider *sdktrace.TracerProvider
)

// TracerProvider returns the provider Setup installed, or nil while tracing is off.
func TracerProvider() trace.TracerProvider {
	mu.Lock()
	defer mu.Unlock()
	if provider == nil {
		return nil
	}
	return provider
}

// Setup turns tracing on when cfg names an endpoint (or an exporter), installing the provider
// and the W3C trace context propagator as OpenTelemetry's globals too; otherwise it does
// nothing. It opens no connection: the exporter connects when it first sends. shutdown
// flushes the spans not yet sent (for at most a few seconds), stops the provider and puts the
// previous globals back. Only one setup may be active at a time.
func Setup(ctx context.Context, cfg Config) (shutdown func(context.Context) error, err error) {
	if cfg.Endpoint == "" && cfg.Exporter == nil {
		return func(context.Context) error { return nil }, nil
	}
	if cfg.SampleRatio < 0 || cfg.SampleRatio > 1 {
		return nil, fmt.Errorf("telemetry: sample ratio %v is not in (0, 1]", cfg.SampleRatio)
	}
	if cfg.ServiceName == "" {
		cfg.ServiceName = "computeql"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", cfg.ServiceName)}
	if cfg.Role != "" {
		attrs = append(attrs, attribute.String("computeql.role", cfg.Role))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if cfg.SampleRatio > 0 {
		opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))))
	}
	if cfg.Exporter != nil {
		opts = append(opts, sdktrace.WithSyncer(cfg.Exporter))
	} else {
		exp, err := otlpExporter(ctx, cfg.Endpoint)
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}

	mu.Lock()
	defer mu.Unlock()
	if provider != nil {
		return nil, errors.New("telemetry: tracing is already set up")
	}
	tp := sdktrace.NewTracerProvider(opts...)
	provider = tp
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	log := cfg.Logger
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing", "err", err)
	}))
	return func(ctx context.Context) error {
		mu.Lock()
		if provider == tp {
			provider = nil
			otel.SetTracerProvider(prevTP)
			otel.SetTextMapPropagator(prevProp)
		}
		mu.Unlock()
		ctx, cancel := context.WithTimeout(ctx, shutdownTimeout)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			return fmt.Errorf("telemetry: shutdown: %w", err)
		}
		return nil
	}, nil
}

// otlpExporter returns an OTLP/HTTP exporter for the endpoint, which it checks itself: the
// exporter would silently fall back to localhost on a URL it cannot parse.
func otlpExporter(ctx context.Context, endpoint string) (sdktrace.SpanExporter, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("telemetry: OTLP endpoint %q is not an http(s) URL such as http://otel-collector:4318", endpoint)
	}
	path := u.Path
	if !strings.HasSuffix(path, "/v1/traces") {
		path = strings.TrimSuffix(path, "/") + "/v1/traces"
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(path)}
	if u.Scheme == "http" {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	return exp, nil
}
