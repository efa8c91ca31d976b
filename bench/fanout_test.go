package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestPerSubscriber(t *testing.T) {
	before := Memory{RSS: 50 << 20, Heap: 8 << 20, Stacks: 1 << 20}
	tests := []struct {
		name      string
		after     Memory
		n         int
		rss, heap float64
	}{
		{"heap and stacks together", Memory{RSS: 250 << 20, Heap: 148 << 20, Stacks: 41 << 20}, 10_000, 200 << 20 / 10_000.0, 180 << 20 / 10_000.0},
		{"twice as many, from the same baseline", Memory{RSS: 250 << 20, Heap: 148 << 20, Stacks: 41 << 20}, 20_000, 200 << 20 / 20_000.0, 180 << 20 / 20_000.0},
		{"resident memory handed back", Memory{RSS: 40 << 20, Heap: 9 << 20, Stacks: 1 << 20}, 1024, -10 << 10, 1 << 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rss, heap := perSubscriber(before, tt.after, tt.n)
			if rss != tt.rss || heap != tt.heap {
				t.Errorf("got %v resident and %v heap and stacks, want %v and %v", rss, heap, tt.rss, tt.heap)
			}
		})
	}
}

// What keeps the fan-out from twice its subscribers is said in the report, and nothing is
// dialled.
func TestFanOutTwiceSkipped(t *testing.T) {
	tests := []struct {
		name    string
		files   fileLimit
		targets int
		want    []string
	}{
		{name: "file limit", files: fileLimit{Soft: 20_000, Short: "the open-file limit is 20,000"}, targets: 10,
			want: []string{"the open-file limit is 20,000"}},
		{name: "too few instances", targets: 9, want: []string{"100 subscribers", "need 10 instances", "has 9", "--instances"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			r := &runner{cfg: Config{Subscribers: 50}, out: &out, start: time.Now(), rep: &Report{}, files: tt.files,
				targets: make([]target, tt.targets)} // no system: a dial would fail
			f := FanOut{Subscribers: 50, Instances: 5}
			if err := r.fanOutTwice(context.Background(), &f); err != nil {
				t.Fatal(err)
			}
			if f.Twice != nil {
				t.Errorf("measured: %+v", f.Twice)
			}
			for _, want := range tt.want {
				if !strings.Contains(f.TwiceSkipped, want) {
					t.Errorf("TwiceSkipped = %q, lacks %q", f.TwiceSkipped, want)
				}
			}
			if !strings.Contains(out.String(), "not measured at 100 subscribers: "+f.TwiceSkipped) {
				t.Errorf("progress does not say so:\n%s", out.String())
			}
		})
	}
}
