package gcfloor

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

const mib = 1 << 20

func TestPercent(t *testing.T) {
	tests := []struct {
		name        string
		base        int
		live, floor uint64
		want        int
	}{
		{name: "nothing live yet: the runtime's least goal stands in", base: 100, live: 0, floor: 64 * mib, want: 1600},
		{name: "below the runtime's least goal", base: 100, live: 1 * mib, floor: 64 * mib, want: 1600},
		{name: "small live heap", base: 100, live: 8 * mib, floor: 64 * mib, want: 800},
		{name: "rounded up, so the goal reaches the floor", base: 100, live: 48 * mib, floor: 64 * mib, want: 134},
		{name: "live heap as large as the floor: GOGC alone", base: 100, live: 64 * mib, floor: 64 * mib, want: 100},
		{name: "live heap past the floor", base: 100, live: 1024 * mib, floor: 64 * mib, want: 100},
		{name: "an operator's larger GOGC is kept", base: 400, live: 32 * mib, floor: 64 * mib, want: 400},
		{name: "an operator's smaller GOGC is raised", base: 50, live: 32 * mib, floor: 64 * mib, want: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percent(tt.base, tt.live, tt.floor); got != tt.want {
				t.Errorf("Percent(%d, %d, %d) = %d, want %d", tt.base, tt.live, tt.floor, got, tt.want)
			}
		})
	}
}

// The goal a percent gives is never below the live heap plus the floor, whatever their sizes.
func TestPercentReachesTheFloor(t *testing.T) {
	for live := uint64(minHeap); live < 512*mib; live = live*3/2 + 12345 {
		for _, floor := range []uint64{1 * mib, 64 * mib, 300*mib + 7} {
			p := Percent(100, live, floor)
			if goal := live + live*uint64(p)/100; goal < live+floor {
				t.Errorf("live %d, floor %d: percent %d gives goal %d, below %d", live, floor, p, goal, live+floor)
			}
		}
	}
}

// withGOGC runs the test at a known GOGC and puts the process's back after it.
func withGOGC(t *testing.T, percent int) {
	old := debug.SetGCPercent(percent)
	t.Cleanup(func() { debug.SetGCPercent(old) })
}

// After each collection the percent is set for the live heap it found, and stop puts GOGC back.
func TestStartTunesAfterEachCollection(t *testing.T) {
	withGOGC(t, 100)
	tuned := make(chan int, 100)
	stop := start(64*mib, func(p int) { tuned <- p })
	first := <-tuned // at start, before any collection
	if first < 100 || readGOGC() != first {
		t.Fatalf("at start: tuned %d, GOGC %d", first, readGOGC())
	}
	for range 3 {
		runtime.GC()
		select {
		case p := <-tuned:
			if got := readGOGC(); got != p || p < 100 {
				t.Fatalf("after a collection: tuned %d, GOGC %d", p, got)
			}
		case <-time.After(time.Minute):
			t.Fatal("not called back after a collection")
		}
	}
	stop()
	if got := readGOGC(); got != 100 {
		t.Errorf("after stop: GOGC %d, want 100 back", got)
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
	stop := Start(128 * mib)
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
		name  string
		gogc  int
		floor uint64
	}{
		{name: "collector off", gogc: -1, floor: 64 * mib},
		{name: "no floor", gogc: 100, floor: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			withGOGC(t, tt.gogc)
			stop := start(tt.floor, func(int) { t.Error("tuned") })
			if got := readGOGC(); got != tt.gogc {
				t.Errorf("GOGC %d, want %d untouched", got, tt.gogc)
			}
			stop()
		})
	}
}

// Once stopped, the finalizer armed before stop changes nothing when it runs.
func TestStoppedTunerTunesNoMore(t *testing.T) {
	withGOGC(t, 100)
	stop := start(64*mib, func(int) {})
	if readGOGC() == 100 {
		t.Fatal("the floor did not raise GOGC at start")
	}
	stop()
	stop() // twice is harmless
	// The tuner's armed finalizer and this one run on the runtime's one finalizer goroutine
	// after the same collection.
	ran := make(chan struct{})
	runtime.SetFinalizer(&sentinel{}, func(*sentinel) { close(ran) })
	runtime.GC()
	select {
	case <-ran:
	case <-time.After(time.Minute):
		t.Fatal("finalizers did not run")
	}
	runtime.GC()
	if got := readGOGC(); got != 100 {
		t.Errorf("after stop and two collections: GOGC %d, want 100", got)
	}
}
