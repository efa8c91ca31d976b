// Package gcfloor keeps the Go heap from being collected while it has grown by less than a
// floor since the last collection.
//
// Go collects when the heap has grown by GOGC percent of what the last collection scanned (the
// live heap, goroutine stacks, globals). A serving process keeps little live (a few MiB) and
// allocates fast (a request's parse, validation and answer), so at the default GOGC of 100 it
// collects every few MiB, dozens of times a second, and the collector's fixed work per cycle
// takes a fifth of its CPU. The floor lets the heap grow by at least its size between
// collections: with little live Go collects a few times a second instead, and once what is
// scanned is larger than the floor, GOGC alone decides as before, so memory still grows with
// it in the same proportion and never more than the floor above it.
//
// The percent is set again after every collection, from what that collection found, so a
// live heap that grows fast (thousands of subscribers connecting) runs on a percent meant for a
// small one only from the end of that collection to the moment its finalizer runs. A process
// has one floor at a time: Start is called once, by main's wiring.
package gcfloor

import (
	"math"
	"math/bits"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// minHeap is the Go runtime's least heap goal at GOGC=100 (4 MiB), which it scales with GOGC:
// a percent computed for less than it would raise that least goal past the floor.
const minHeap = 4 << 20

// goalPercent returns the GOGC percent with which the next heap goal is at least the live heap
// plus floor, and never less than base. The runtime's goal is the live heap plus percent of
// what a collection scans (the live heap, goroutine stacks and globals), so scanned is that
// sum.
func goalPercent(base int, scanned, floor uint64) int {
	scanned = max(scanned, minHeap)
	hi, lo := bits.Mul64(floor, 100)
	if hi != 0 {
		return math.MaxInt32
	}
	p := lo / scanned
	if lo%scanned != 0 {
		p++ // rounded up: the goal reaches the floor
	}
	if p > math.MaxInt32 {
		return math.MaxInt32
	}
	return max(base, int(p))
}

// active is set while a floor is kept: the state is the process's.
var active atomic.Bool

// Start keeps a floor of floor bytes under every heap goal until the returned stop is called,
// which restores GOGC to what it was. GOGC=off (the collector turned off), a floor of 0 and a
// second Start while one floor is kept leave GOGC alone. It starts no goroutine of its own:
// the runtime's finalizer goroutine calls it back after each collection, so a finalizer that
// blocks (none of this program's does) would hold the floor where it was.
func Start(floor uint64) (stop func()) {
	return start(floor, nil)
}

// start is Start with tuned, when not nil, called after each tune with the percent set, or -1
// once stopped (tests await it).
func start(floor uint64, tuned func(percent int)) (stop func()) {
	base := readGOGC()
	if floor == 0 || base < 0 || !active.CompareAndSwap(false, true) {
		return func() {}
	}
	t := &tuner{base: base, floor: floor, tuned: tuned, percent: base, samples: []metrics.Sample{
		{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"},
	}}
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

// arm has the runtime call tune after the next collection, on its finalizer goroutine. (A
// cleanup, runtime.AddCleanup, would not wait behind other finalizers, but one queued after a
// collection was seen to wait for the next collection before it ran.)
func (t *tuner) arm() {
	runtime.SetFinalizer(&sentinel{}, func(*sentinel) {
		if t.tune() {
			t.arm()
		}
	})
}

// tune sets the percent for what the last collection found; it reports false once stopped.
func (t *tuner) tune() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := -1
	if !t.stopped {
		metrics.Read(t.samples)
		var scanned uint64
		for _, s := range t.samples {
			scanned += s.Value.Uint64()
		}
		p = goalPercent(t.base, scanned, t.floor)
		if p != t.percent {
			debug.SetGCPercent(p)
			t.percent = p
		}
	}
	if t.tuned != nil {
		t.tuned(p)
	}
	return !t.stopped
}

func (t *tuner) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped {
		t.stopped = true
		t.percent = t.base
		debug.SetGCPercent(t.base)
		active.Store(false)
	}
}

// readGOGC returns the GOGC percent in force, -1 for off.
func readGOGC() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	v := s[0].Value.Uint64()
	if v > math.MaxInt32 {
		return -1
	}
	return int(v)
}
