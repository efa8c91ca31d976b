package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/telemetry"
)

// Options configure a Worker.
type Options struct {
	Store  Store
	Region region.Client
	Queue  *queue.Queue
	// Organizations lists the organizations the resync walks. Required.
	Organizations func() []string
	// NetworkExists says whether a network is still in the region's catalogue. Required.
	NetworkExists func(id string) bool
	// Concurrency is how many instances are reconciled at once. Defaults to 8.
	Concurrency int
	// Yield is how soon an instance whose server is still building is looked at again.
	// Defaults to 1s; server events usually wake it sooner.
	Yield time.Duration
	// CapacityRetry is how soon a server the region had no room for is tried again.
	// Defaults to 15s.
	CapacityRetry time.Duration
	// UnreachableRetry is how soon an instance whose region's host cannot be reached is looked
	// at again. Defaults to 10s; the host's return usually wakes it sooner.
	UnreachableRetry time.Duration
	// Servers lists every server of the regions, for the resync's collection of orphans.
	// Defaults to none: no collection.
	Servers func(context.Context) ([]region.Server, error)
	// ResyncInterval defaults to 30s.
	ResyncInterval time.Duration
	// Consumer tunes the queue consumer; Concurrency, OnDeadLetter, Logger, Registerer and
	// TracerProvider are set from the fields of these Options.
	Consumer queue.ConsumerOptions
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics. Defaults to none.
	Registerer prometheus.Registerer
	// Now defaults to time.Now.
	Now func() time.Time
	// TracerProvider gets a span per queue message and per reconcile. Defaults to the one
	// telemetry.Setup installed: none, and so no spans, while tracing is off.
	TracerProvider trace.TracerProvider
}

// Worker reconciles instances from the queue, watches the region and resyncs.
type Worker struct {
	consumer *queue.Consumer
	watcher  *Watcher
	resync   *Resync
}

// New returns a worker with opts' defaults applied; Start runs it.
func New(opts Options) (*Worker, error) {
	if opts.Store == nil || opts.Region == nil || opts.Queue == nil || opts.Organizations == nil || opts.NetworkExists == nil {
		return nil, errors.New("worker: Store, Region, Queue, Organizations and NetworkExists are required")
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = 8
	}
	if opts.Yield == 0 {
		opts.Yield = time.Second
	}
	if opts.CapacityRetry == 0 {
		opts.CapacityRetry = 15 * time.Second
	}
	if opts.UnreachableRetry == 0 {
		opts.UnreachableRetry = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.TracerProvider == nil {
		opts.TracerProvider = telemetry.TracerProvider()
	}
	m, err := NewMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	rec := &Reconciler{Store: opts.Store, Region: opts.Region, NetworkExists: opts.NetworkExists, Yield: opts.Yield, CapacityRetry: opts.CapacityRetry, UnreachableRetry: opts.UnreachableRetry, Logger: opts.Logger, Now: opts.Now, Metrics: m}
	co := opts.Consumer
	co.Concurrency, co.OnDeadLetter, co.Logger, co.Registerer = opts.Concurrency, rec.MarkFailed, opts.Logger, opts.Registerer
	var h queue.Handler = rec
	if opts.TracerProvider != nil {
		h = tracedHandler{next: rec, tracer: opts.TracerProvider.Tracer("github.com/computeql/computeql/worker")}
		co.TracerProvider = opts.TracerProvider
	}
	consumer, err := opts.Queue.NewConsumer(h, co)
	if err != nil {
		return nil, err
	}
	return &Worker{
		consumer: consumer,
		watcher:  &Watcher{Region: opts.Region, Store: opts.Store, Queue: opts.Queue, Logger: opts.Logger, Metrics: m},
		resync: &Resync{Store: opts.Store, Queue: opts.Queue, Organizations: opts.Organizations,
			Interval: opts.ResyncInterval, Servers: opts.Servers, Region: opts.Region, Logger: opts.Logger, Metrics: m},
	}, nil
}

// Start runs the worker until ctx ends. Shutdown order: the watcher and the resync stop taking
// new work at once; the consumer then lets in-flight reconciles finish within its shutdown
// timeout and leaves the rest pending for other workers. Start returns when all have stopped.
func (w *Worker) Start(ctx context.Context) error {
	// If the consumer stops for any reason, the watcher and the resync stop with it: they only
	// feed the consumer.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { w.watcher.Start(ctx) })
	wg.Go(func() { w.resync.Start(ctx) })
	err := w.consumer.Start(ctx)
	cancel()
	wg.Wait()
	return err
}
