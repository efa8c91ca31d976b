package bench

import (
	"slices"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"one value is every percentile", ms(7), 99, 7 * time.Millisecond},
		{"p50 of two is the first", ms(1, 2), 50, time.Millisecond},
		{"p50 of three is the middle", ms(1, 2, 3), 50, 2 * time.Millisecond},
		{"p99 of 100 is the 99th", ms(hundred...), 99, 99 * time.Millisecond},
		{"p90 of 100 is the 90th", ms(hundred...), 90, 90 * time.Millisecond},
		{"p100 is the max", ms(hundred...), 100, 100 * time.Millisecond},
		{"p99 of ten is the max", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10 * time.Millisecond},
		{"p0 is the min", ms(4, 5, 6), 0, 4 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tt.sorted, tt.p, got, tt.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	sample := []time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond, 1500 * time.Microsecond}
	before := slices.Clone(sample)
	got := summarize(sample)
	want := Latency{Count: 4, P50: 1.5, P90: 3, P99: 3, Max: 3}
	if got != want {
		t.Errorf("summarize = %+v, want %+v", got, want)
	}
	if !slices.Equal(sample, before) {
		t.Errorf("summarize reordered its input: %v", sample)
	}
	if got := summarize(nil); got != (Latency{}) {
		t.Errorf("summarize(nil) = %+v, want zero", got)
	}
}

func TestThroughput(t *testing.T) {
	tests := []struct {
		ops     int
		elapsed time.Duration
		want    float64
	}{
		{1000, 2 * time.Second, 500},
		{0, time.Second, 0},
		{10, 0, 0}, // nothing measured: no rate rather than infinity
	}
	for _, tt := range tests {
		if got := throughput(tt.ops, tt.elapsed).PerSecond; got != tt.want {
			t.Errorf("throughput(%d, %v) = %v/s, want %v/s", tt.ops, tt.elapsed, got, tt.want)
		}
	}
}
