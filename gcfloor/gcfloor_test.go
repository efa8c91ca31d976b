package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

const mib = 1 << 20

func TestGoalPercent(t *testing.T) {
	tests := []struct {
		name           string
		base           int
		scanned, floor uint64
		want           int
	}{
		{name: "nothing scanned yet: the runtime's least goal stands in", base: 100, scanned: 0, floor: 64 * mib, want: 1600},
		{name: "below the runtime's least goal", base: 100, scanned: 1 * mib, floor: 64 * mib, want: 1600},
		{name: "small heap", base: 100, scanned: 8 * mib, floor: 64 * mib, want: 800},
		{name: "rounded up, so the goal reaches the floor", base: 100, scanned: 48 * mib, floor: 64 * mib, want: 134},
		{name: "as much scanned as the floor: GOGC alone", base: 100, scanned: 64 * mib, floor: 64 * mib, want: 100},
		{name: "past the floor", base: 100, scanned: 1024 * mib, floor: 64 * mib, want: 100},
		{name: "an operator's larger GOGC is kept", base: 400, scanned: 32 * mib, floor: 64 * mib, want: 400},
		{name: "an operator's smaller GOGC is raised", base: 50, scanned: 32 * mib, floor: 64 * mib, want: 200},
		{name: "a floor too large to compute: the largest percent", base: 100, scanned: 8 * mib, floor: 1 << 62, want: 1<<31 - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := goalPercent(tt.base, tt.scanned, tt.floor); got != tt.want {
				t.Errorf("goalPercent(%d, %d, %d) = %d, want %d", tt.base, tt.scanned, tt.floor, got, tt.want)
			}
		})
	}
}

// The runtime's goal is the live heap plus percent of the live heap, stacks and globals; with
// the percent for their sum it is never below the live heap plus the floor.
func TestGoalPercentReachesTheFloor(t *testing.T) {
	for live := uint64(minHeap); live < 512*mib; live = live*3/2 + 12345 {
		for _, stacks := range []uint64{0, 10 * mib} {
			for _, floor := range []uint64{1 * mib, 64 * mib, 300*mib + 7} {
				p := goalPercent(100, live+stacks, floor)
				if goal := live + (live+stacks)*uint64(p)/100; goal < live+floor {
					t.Errorf("live %d, stacks %d, floor %d: percent %d gives goal %d, below %d", live, stacks, floor, p, goal, live+floor)
				}
			}
		}
	}
}

// withGOGC runs the test at a known GOGC and puts the process's back after it.
func withGOGC(t *testing.T, percent int) {
	old := debug.SetGCPercent(percent)
	t.Cleanup(func() { debug.SetGCPercent(old) })
}

// tune is one callback of the tuner: the percent it set, and the collections done by then.
type tune struct {
	percent int
	cycles  uint64
}

func cycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// startFloor starts a floor for the test, stopped when it ends, whose tunes arrive on the
// returned channel. It collects first, so that its first tune is of what this test holds, not
// of what an earlier one did.
func startFloor(t *testing.T, floor uint64) (tuned chan tune, stop func()) {
	runtime.GC()
	tuned = make(chan tune, 1000)
	stop = start(floor, func(p int) { tuned <- tune{p, cycles()} })
	t.Cleanup(stop)
	return tuned, stop
}

// next collects and waits for the tune after that collection; tunes of earlier collections
// (the runtime's own, while the test allocated) are passed over.
func next(t *testing.T, tuned chan tune) int {
	t.Helper()
	runtime.GC()
	done := cycles()
	for {
		select {
		case tu := <-tuned:
			if tu.cycles >= done {
				return tu.percent
			}
		case <-time.After(time.Minute):
			t.Fatal("not called back after a collection")
			return 0
		}
	}
}

// After each collection the percent is set for what it found, and stop puts GOGC back.
func TestStartTunesAfterEachCollection(t *testing.T) {
	withGOGC(t, 100)
	tuned, stop := startFloor(t, 64*mib)
	if first := (<-tuned).percent; first <= 100 || readGOGC() != first {
		t.Fatalf("at start: tuned %d, GOGC %d", first, readGOGC())
	}
	for range 3 {
		if p := next(t, tuned); p <= 100 || readGOGC() != p {
			t.Fatalf("after a collection: tuned %d, GOGC %d", p, readGOGC())
		}
	}
	stop()
	if got := readGOGC(); got != 100 {
		t.Errorf("after stop: GOGC %d, want 100 back", got)
	}
}

// keep holds a live heap larger than the floor.
var keep [][]byte

// Once what is live outgrows the floor, GOGC alone decides again; when it shrinks, the floor
// is back.
func TestPercentFollowsTheLiveHeap(t *testing.T) {
	withGOGC(t, 100)
	tuned, _ := startFloor(t, 32*mib)
	<-tuned
	t.Cleanup(func() { keep = nil })
	for range 96 {
		keep = append(keep, make([]byte, mib))
	}
	if p := next(t, tuned); p != 100 || readGOGC() != 100 {
		t.Errorf("96 MiB live, a 32 MiB floor: tuned %d, GOGC %d, want 100", p, readGOGC())
	}
	keep = nil
	if p := next(t, tuned); p <= 100 || readGOGC() != p {
		t.Errorf("little live again: tuned %d, GOGC %d, want above 100", p, readGOGC())
	}
}

// With the floor, allocating far more than the floor in garbage takes a few collections; at
// GOGC=100 alone, one every few MiB.
func TestFloorCollectsLessOften(t *testing.T) {
	withGOGC(t, 100)
	collections := func() uint32 {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 512 * 16 {
			sink = make([]byte, 64<<10) // 512 MiB in all, 64 KiB at a time, none kept
		}
		runtime.ReadMemStats(&after)
		return after.NumGC - before.NumGC
	}
	without := collections()
	_, stop := startFloor(t, 128*mib)
	with := collections()
	stop()
	if with > without/4 {
		t.Errorf("512 MiB of garbage: %d collections with a 128 MiB floor, %d without", with, without)
	}
	t.Logf("512 MiB of garbage: %d collections with a 128 MiB floor, %d without", with, without)
}

var sink []byte

func TestStartLeavesGOGCAlone(t *testing.T) {
	tests := []struct {
		name   string
		gogc   int
		floor  uint64
		before bool // a floor kept already
	}{
		{name: "collector off", gogc: -1, floor: 64 * mib},
		{name: "no floor", gogc: 100, floor: 0},
		{name: "a floor kept already", gogc: 100, floor: 64 * mib, before: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			withGOGC(t, tt.gogc)
			want := tt.gogc
			if tt.before {
				startFloor(t, 8*mib)
				want = readGOGC()
			}
			stop := start(tt.floor, func(int) { t.Error("tuned") })
			if got := readGOGC(); got != want {
				t.Errorf("GOGC %d, want %d untouched", got, want)
			}
			stop()
			if got := readGOGC(); got != want {
				t.Errorf("after its stop: GOGC %d, want %d untouched", got, want)
			}
		})
	}
}

// Once stopped, the finalizer armed before stop changes nothing when it runs.
func TestStoppedTunerTunesNoMore(t *testing.T) {
	withGOGC(t, 100)
	tuned, stop := startFloor(t, 64*mib)
	if (<-tuned).percent == 100 {
		t.Fatal("the floor did not raise GOGC at start")
	}
	stop()
	stop() // twice is harmless
	if p := next(t, tuned); p != -1 {
		t.Errorf("after stop: tuned %d", p)
	}
	if got := readGOGC(); got != 100 {
		t.Errorf("after stop and a collection: GOGC %d, want 100", got)
	}
}

// grow uses about n KiB of stack (its frames' arrays stay on the stack: nothing keeps them),
// says so on grown, then waits for release.
func grow(n int, grown, release chan struct{}) byte {
	var pad [1024]byte
	pad[n%len(pad)] = byte(n)
	if n > 0 {
		return pad[0] + grow(n-1, grown, release)
	}
	grown <- struct{}{}
	<-release
	return pad[0]
}

// Goroutine stacks count: the runtime's goal grows with them too, so a floor no larger than
// what the stacks alone take raises nothing.
func TestStacksCount(t *testing.T) {
	withGOGC(t, 100)
	release := make(chan struct{})
	grown := make(chan struct{}, 1000)
	var growers sync.WaitGroup
	for range 1000 {
		growers.Go(func() { grow(64, grown, release) }) // 64 MiB of stacks in all, nothing on the heap
	}
	t.Cleanup(func() {
		close(release)
		growers.Wait()
	})
	for range 1000 {
		<-grown
	}
	tuned, _ := startFloor(t, 32*mib)
	<-tuned
	if p := next(t, tuned); p != 100 {
		t.Errorf("64 MiB of stacks, a 32 MiB floor: tuned %d, want 100", p)
	}
}
