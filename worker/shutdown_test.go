package worker_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/metrictest"
	"github.com/computeql/computeql/worker"
)

// Worker.Start returns soon after its context ends, even with reconciles in flight, and leaves
// no goroutine behind; the work it did not finish is picked up by the next worker.
func TestShutdownWhileReconciling(t *testing.T) {
	e := newEnv(t, func(s *setup) {
		s.manual = true
		// Every region call takes a while, so reconciles are in flight when the worker stops.
		s.sim.Faults.SlowCalls = 100 * time.Millisecond
	})
	var insts []*instance.Instance
	for i := range 8 {
		insts = append(insts, e.create(t, fmt.Sprintf("web-%d", i)))
	}
	baseline := runtime.NumGoroutine()
	e.start(t)
	eventually.Holds(t, convergeLimit, func() bool {
		return metrictest.Value(t, e.reg, "computeql_queue_inflight") > 0
	}, "reconciles in flight")

	start := time.Now()
	if err := e.work.stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("worker stopped %s after its context ended", time.Since(start).Round(time.Millisecond))
	if err := e.clock.stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after the worker stopped, %d before:\n%s", runtime.NumGoroutine(), baseline, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}

	// A new worker finishes the job: its first resync pass (or reclaiming what the first left
	// pending, after the lease) finds every unfinished instance.
	next, err := worker.New(worker.Options{
		Store: e.st, Region: e.probe, Queue: e.q, Logger: quiet, Registerer: prometheus.NewRegistry(),
		Organizations: func() []string { return []string{"acme"} },
		NetworkExists: func(string) bool { return true },
		Concurrency:   4, Yield: 50 * time.Millisecond,
		Consumer: e.consumerOptions,
	})
	if err != nil {
		t.Fatal(err)
	}
	goRun(t, "region clock", e.probe.Run)
	goRun(t, "next worker", next.Start)
	for _, inst := range insts {
		got := e.waitRunning(t, inst.ID)
		if srvs := e.servers(t, got); len(srvs) != 1 {
			t.Errorf("%s has %d servers, want 1", got.Name, len(srvs))
		}
	}
}
