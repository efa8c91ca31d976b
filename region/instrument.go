package region

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// callOp names a Client call in metrics and spans.
type callOp int

const (
	opFindServers callOp = iota
	opCreateServer
	opUpdateNetworking
	opGetServer
	opDeleteServer
	opStartServer
	opStopServer
	opRebootServer
	opResizeServer
	opConsoleOutput
	opOpenConsole
	opSSHKey
	opSnapshot
	opImages
	opDeleteImage
	numOps
)

var opNames = [numOps]string{
	"FindServers", "CreateServer", "UpdateNetworking", "GetServer", "DeleteServer", "StartServer",
	"StopServer", "RebootServer", "ResizeServer", "ConsoleOutput", "OpenConsole", "SSHKey", "Snapshot", "Images",
	"DeleteImage",
}

// Instrument returns c with every call timed and traced: a client span "region.<Op>" per call
// when tp is set, and with reg set the metrics computeql_region_call_duration_seconds{op} and
// computeql_region_call_errors_total{op}. With neither it returns c itself.
//
// A call has failed when the region did not answer (ErrUnavailable, a timeout, any other
// error); its refusals (ErrRefused), ErrServerNotFound and ErrImageNotFound are answers,
// recorded on the span as region.outcome but not counted as errors, so that an alert on the
// error rate means the region is in trouble rather than that users asked for something
// impossible. Watch is passed
// through untouched: it lasts as long as the watcher, so neither a latency nor a span fits it.
func Instrument(c Client, tp trace.TracerProvider, reg prometheus.Registerer) (Client, error) {
	if tp == nil && reg == nil {
		return c, nil
	}
	ic := &instrumented{next: c}
	if tp != nil {
		ic.tracer = tp.Tracer("github.com/computeql/computeql/region")
	}
	if reg != nil {
		duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "computeql_region_call_duration_seconds",
			Help:    "Time a call to the region takes, by operation; failed calls included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 14),
		}, []string{"op"})
		failures := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "computeql_region_call_errors_total",
			Help: "Calls to the region that failed (refusals and not-found answers excluded), by operation.",
		}, []string{"op"})
		for _, col := range []prometheus.Collector{duration, failures} {
			if err := reg.Register(col); err != nil {
				return nil, fmt.Errorf("region metrics: %w", err)
			}
		}
		// Resolved once, so that a call does no label lookup.
		ic.metrics = make([]callMetrics, numOps)
		for op, name := range opNames {
			ic.metrics[op] = callMetrics{duration: duration.WithLabelValues(name), failures: failures.WithLabelValues(name)}
		}
	}
	return ic, nil
}

type callMetrics struct {
	duration prometheus.Observer
	failures prometheus.Counter
}

type instrumented struct {
	next    Client
	tracer  trace.Tracer  // nil: no spans
	metrics []callMetrics // nil: no metrics
}

// call is one call in progress.
type call struct {
	ic    *instrumented
	op    callOp
	start time.Time
	span  trace.Span // nil when not traced
}

// begin starts timing and, when traced, the call's span; serverID, when known, names the
// server the call acts on.
func (ic *instrumented) begin(ctx context.Context, op callOp, serverID string) (context.Context, call) {
	k := call{ic: ic, op: op, start: time.Now()}
	if ic.tracer != nil {
		ctx, k.span = ic.tracer.Start(ctx, "region."+opNames[op], trace.WithSpanKind(trace.SpanKindClient))
		k.span.SetAttributes(attribute.String("region.op", opNames[op]))
		k.setServer(serverID)
	}
	return ctx, k
}

// setServer records the server the call acted on.
func (k call) setServer(id string) {
	if k.span != nil && id != "" {
		k.span.SetAttributes(attribute.String("region.server_id", id))
	}
}

// end records the call's latency and outcome.
func (k call) end(err error) {
	failed := err != nil && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrServerNotFound) && !errors.Is(err, ErrImageNotFound)
	if k.ic.metrics != nil {
		m := k.ic.metrics[k.op]
		m.duration.Observe(time.Since(k.start).Seconds())
		if failed {
			m.failures.Inc()
		}
	}
	if k.span == nil {
		return
	}
	outcome := "ok"
	switch {
	case failed:
		outcome = "error"
		k.span.RecordError(err)
		k.span.SetStatus(codes.Error, err.Error())
	case errors.Is(err, ErrRefused):
		outcome = "refused"
	case err != nil:
		outcome = "not_found"
	}
	k.span.SetAttributes(attribute.String("region.outcome", outcome))
	k.span.End()
}

func (ic *instrumented) FindServers(ctx context.Context, scope Scope, tag, value string) ([]Server, error) {
	ctx, k := ic.begin(ctx, opFindServers, "")
	s, err := ic.next.FindServers(ctx, scope, tag, value)
	k.end(err)
	return s, err
}

func (ic *instrumented) CreateServer(ctx context.Context, spec ServerSpec) (Server, error) {
	ctx, k := ic.begin(ctx, opCreateServer, "")
	s, err := ic.next.CreateServer(ctx, spec)
	k.setServer(s.ID)
	k.end(err)
	return s, err
}

func (ic *instrumented) UpdateNetworking(ctx context.Context, id string, n ServerNetworking) (Server, error) {
	ctx, k := ic.begin(ctx, opUpdateNetworking, id)
	s, err := ic.next.UpdateNetworking(ctx, id, n)
	k.end(err)
	return s, err
}

func (ic *instrumented) GetServer(ctx context.Context, id string) (Server, error) {
	ctx, k := ic.begin(ctx, opGetServer, id)
	s, err := ic.next.GetServer(ctx, id)
	k.end(err)
	return s, err
}

func (ic *instrumented) DeleteServer(ctx context.Context, id string) error {
	ctx, k := ic.begin(ctx, opDeleteServer, id)
	err := ic.next.DeleteServer(ctx, id)
	k.end(err)
	return err
}

func (ic *instrumented) StartServer(ctx context.Context, id string) (Server, error) {
	ctx, k := ic.begin(ctx, opStartServer, id)
	s, err := ic.next.StartServer(ctx, id)
	k.end(err)
	return s, err
}

func (ic *instrumented) StopServer(ctx context.Context, id string) (Server, error) {
	ctx, k := ic.begin(ctx, opStopServer, id)
	s, err := ic.next.StopServer(ctx, id)
	k.end(err)
	return s, err
}

func (ic *instrumented) RebootServer(ctx context.Context, id string, hard bool) (Server, error) {
	ctx, k := ic.begin(ctx, opRebootServer, id)
	s, err := ic.next.RebootServer(ctx, id, hard)
	k.end(err)
	return s, err
}

func (ic *instrumented) ResizeServer(ctx context.Context, id, flavorID string) (Server, error) {
	ctx, k := ic.begin(ctx, opResizeServer, id)
	s, err := ic.next.ResizeServer(ctx, id, flavorID)
	k.end(err)
	return s, err
}

func (ic *instrumented) ConsoleOutput(ctx context.Context, id string, tailBytes int) (ConsoleOutput, error) {
	ctx, k := ic.begin(ctx, opConsoleOutput, id)
	out, err := ic.next.ConsoleOutput(ctx, id, tailBytes)
	k.end(err)
	return out, err
}

func (ic *instrumented) OpenConsole(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	ctx, k := ic.begin(ctx, opOpenConsole, id)
	c, err := ic.next.OpenConsole(ctx, id)
	k.end(err)
	return c, err
}

func (ic *instrumented) SSHKey(ctx context.Context, id string) (SSHKey, error) {
	ctx, k := ic.begin(ctx, opSSHKey, id)
	key, err := ic.next.SSHKey(ctx, id)
	k.end(err)
	return key, err
}

func (ic *instrumented) Snapshot(ctx context.Context, id string, req ImageRequest) (Image, error) {
	ctx, k := ic.begin(ctx, opSnapshot, id)
	img, err := ic.next.Snapshot(ctx, id, req)
	k.end(err)
	return img, err
}

func (ic *instrumented) Images(ctx context.Context, org, project string) ([]Image, error) {
	ctx, k := ic.begin(ctx, opImages, "")
	imgs, err := ic.next.Images(ctx, org, project)
	k.end(err)
	return imgs, err
}

func (ic *instrumented) DeleteImage(ctx context.Context, org, project, id string) error {
	ctx, k := ic.begin(ctx, opDeleteImage, "")
	err := ic.next.DeleteImage(ctx, org, project, id)
	k.end(err)
	return err
}

func (ic *instrumented) Watch(ctx context.Context, after string, fn func(Event) error) error {
	return ic.next.Watch(ctx, after, fn)
}
