// Package gcfloor keeps the Go heap from being collected while it has grown by less than a
// floor since the last collection.
//
// Go collects when the heap has grown by GOGC percent of what the last collection left live.
// A serving process keeps little live (a few MiB) and allocates fast (a request's parse,
// validation and answer), so at the default GOGC of 100 it collects every few MiB, dozens of
// times a second, and the collector's fixed work per cycle (stacks, globals, the stop-the-world
// phases) takes a fifth of its CPU. The floor lets the heap grow by at least its size between
// collections: with a small live heap Go collects a few times a second instead, and once the
// live heap is larger than the floor, GOGC alone decides as before, so memory still grows with
// the live heap in the same proportion and never more than the floor above it.
//
// The percent is set again after every collection, from the live heap that collection found,
// so a live heap that grows fast (thousands of subscribers connecting) never runs on a percent
// meant for a small one for longer than one cycle.
package gcfloor

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// minHeap is the Go runtime's least heap goal at GOGC=100 (4 MiB), which it scales with GOGC:
// a percent computed for a live heap smaller than it would raise that least goal past the
// floor.
const minHeap = 4 << 20

// Percent returns the GOGC percent with which the next heap goal (the live heap plus percent
// of it) is at least the live heap plus floor, and never less than base.
func Percent(base int, live, floor uint64) int {
	live = max(live, minHeap)
	p := (floor*100 + live - 1) / live // rounded up: the goal reaches the floor
	if p > math.MaxInt32 {
		return math.MaxInt32
	}
	return max(base, int(p))
}

// Start keeps a floor of floor bytes under every heap goal until the returned stop is called,
// which restores GOGC to what it was. GOGC=off (the collector turned off) and a floor of 0
// leave GOGC alone. It starts no goroutine: the runtime calls it back after each collection.
func Start(floor uint64) (stop func()) {
	return start(floor, nil)
}

// start is Start with tuned, when not nil, called with each percent set (tests await it).
func start(floor uint64, tuned func(percent int)) (stop func()) {
	base := readGOGC()
	if floor == 0 || base < 0 {
		return func() {}
	}
	t := &tuner{base: base, floor: floor, tuned: tuned, percent: base,
		samples: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	t.tune()
	t.arm()
	return t.stop
}

// tuner holds the floor's state between collections.
type tuner struct {
	base  int
	floor uint64
	tuned func(int)

	mu      sync.Mutex
	stopped bool
	percent int
	samples []metrics.Sample
}

// sentinel is garbage from the start: its finalizer runs after the collection that finds it
// unreachable, and arms the next one.
type sentinel struct{ _ [16]byte } // neither zero-sized nor tiny: the runtime may never finalize those

func (t *tuner) arm() {
	runtime.SetFinalizer(&sentinel{}, func(*sentinel) {
		if t.tune() {
			t.arm()
		}
	})
}

// tune sets the percent for the live heap the last collection found; it reports false once
// stopped.
func (t *tuner) tune() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	metrics.Read(t.samples)
	p := Percent(t.base, t.samples[0].Value.Uint64(), t.floor)
	if p != t.percent {
		debug.SetGCPercent(p)
		t.percent = p
	}
	if t.tuned != nil {
		t.tuned(p)
	}
	return true
}

func (t *tuner) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped {
		t.stopped = true
		t.percent = t.base
		debug.SetGCPercent(t.base)
	}
}

// readGOGC returns the GOGC percent in force, -1 for off.
func readGOGC() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 100
	}
	v := s[0].Value.Uint64()
	if v > math.MaxInt32 {
		return -1
	}
	return int(v)
}
