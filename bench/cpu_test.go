package bench

import (
	"os"
	"testing"
	"time"
)

// processCPU reads a process's user and system time from /proc: for this process, what
// getrusage says, to /proc's resolution of a clock tick.
func TestProcessCPU(t *testing.T) {
	self := func() time.Duration {
		d, err := selfCPU()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// Enough CPU time for the reading to be many ticks.
	for start, x := self(), 0; self()-start < 100*time.Millisecond; x++ {
		_ = x * x
	}
	before := self()
	got, err := processCPU(os.Getpid())
	after := self()
	if err != nil {
		t.Fatal(err)
	}
	const tick = time.Second / clockTicks
	if got < before-2*tick || got > after+tick {
		t.Errorf("processCPU = %s, getrusage %s to %s", got, before, after)
	}
	if _, err := processCPU(1 << 30); err == nil {
		t.Errorf("processCPU of no process: no error")
	}
}

// The cost per request is each process's CPU time between two readings over the requests;
// without the server's, the table says it was not measured and has no ratio.
func TestCPUCost(t *testing.T) {
	a := cpuTimes{client: time.Second, server: 2 * time.Second, redis: 3 * time.Second}
	b := cpuTimes{client: 2 * time.Second, server: 4 * time.Second, redis: 3500 * time.Millisecond}
	got := b.per(a, 10_000)
	if *got != (CPUCost{Client: 100, Server: 200, Redis: 50}) {
		t.Errorf("per = %+v", *got)
	}
	if b.per(a, 0) != nil {
		t.Errorf("per of no requests is not nil")
	}
	noServer := &CPUCost{Client: 80, Redis: 60}
	if v := cpuValue(noServer); v != "80 / not measured / 60 µs" {
		t.Errorf("cpuValue = %q", v)
	}
	if v := cpuValue(nil); v != "not measured" {
		t.Errorf("cpuValue(nil) = %q", v)
	}
	if r := cpuRatio(noServer, &CPUCost{Client: 40, Server: 30, Redis: 1}); r != "n/a" {
		t.Errorf("ratio without the server's share = %q, want n/a", r)
	}
}
