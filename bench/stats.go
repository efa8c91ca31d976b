package bench

import (
	"math"
	"slices"
	"time"
)

// Latency summarises a sample of latencies. Figures are milliseconds, the unit the report
// shows.
type Latency struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50Ms"`
	P90   float64 `json:"p90Ms"`
	P99   float64 `json:"p99Ms"`
	Max   float64 `json:"maxMs"`
}

// summarize returns the percentiles of the sample, which it leaves unchanged.
func summarize(sample []time.Duration) Latency {
	if len(sample) == 0 {
		return Latency{}
	}
	sorted := slices.Clone(sample)
	slices.Sort(sorted)
	return Latency{
		Count: len(sorted),
		P50:   ms(percentile(sorted, 50)),
		P90:   ms(percentile(sorted, 90)),
		P99:   ms(percentile(sorted, 99)),
		Max:   ms(sorted[len(sorted)-1]),
	}
}

// percentile is the nearest-rank percentile of a sorted, non-empty sample: the smallest value
// that at least p percent of the sample is less than or equal to. Unlike interpolation it is
// always a latency that was measured.
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Throughput is how many operations ran in how long.
type Throughput struct {
	Ops       int     `json:"ops"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"perSecond"`
}

func throughput(ops int, elapsed time.Duration) Throughput {
	t := Throughput{Ops: ops, Seconds: elapsed.Seconds()}
	if elapsed > 0 {
		t.PerSecond = float64(ops) / elapsed.Seconds()
	}
	return t
}
