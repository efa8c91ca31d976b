package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sampleReport is a full-size run whose create figures miss their targets and whose others
// meet them.
func sampleReport() *Report {
	r := &Report{
		Date: time.Date(2026, 11, 22, 9, 30, 0, 0, time.UTC), Command: "computeql bench",
		Machine: Machine{CPU: "Test CPU", Cores: 2, MemoryMiB: 24103, OS: "linux/amd64", Go: "go1.26.8", Redis: "7.0.15",
			LoadStart: [3]float64{1.5, 1, 1}, LoadEnd: [3]float64{2.25, 1, 1}},
		System: "against an embedded system",
		Sizes:  Sizes{Concurrency: 64, CreateRate: 1000, ChurnRate: 200, Instances: 2000, Subscribers: 10_000},
		Limits: Limits{
			Ping: Latency{Count: 2000, P50: 0.05, P99: 0.1}, XAdd: Throughput{PerSecond: 40000}, XReadGroup: Throughput{PerSecond: 20000},
			Bare:     Load{Throughput: Throughput{PerSecond: 10000}, Latency: Latency{P99: 10}, CPU: &CPUCost{Client: 40, Server: 30, Redis: 1}},
			BareRate: Load{Latency: Latency{P50: 0.5, P99: 2}},
		},
		Create: Create{
			Concurrency: Load{Requests: 12000, Errors: 0, Throughput: Throughput{PerSecond: 2500}, Latency: Latency{Count: 12000, P50: 20, P90: 30, P99: 40, Max: 90},
				CPU: &CPUCost{Client: 80, Server: 150, Redis: 60.4}},
			Rate: Load{Requests: 5000, Throughput: Throughput{PerSecond: 1000}, Latency: Latency{Count: 5000, P50: 2, P90: 3, P99: 8, Max: 20}},
			Rounds: []Round{
				{Bare: Load{Throughput: Throughput{PerSecond: 10000}, Latency: Latency{P99: 10}}, Create: Load{Throughput: Throughput{PerSecond: 2700}, Latency: Latency{P99: 30}}},
				{Bare: Load{Throughput: Throughput{PerSecond: 10000}, Latency: Latency{P99: 10}}, Create: Load{Throughput: Throughput{PerSecond: 2500}, Latency: Latency{P99: 40}}},
				{Bare: Load{Throughput: Throughput{PerSecond: 12000}, Latency: Latency{P99: 8}}, Create: Load{Throughput: Throughput{PerSecond: 2000}, Latency: Latency{P99: 50}}},
			},
			Median: 1,
		},
		Convergence: Convergence{Instances: 2000, Converged: 2000, Seconds: 4, PerSecond: 500, Latency: Latency{P50: 1000, P99: 3000}},
		Propagation: Propagation{Commit: Latency{P50: 1, P99: 5}, Subscriber: Latency{P50: 2, P99: 10}},
		FanOut: FanOut{Subscribers: 10_000, Instances: 1000, DialSeconds: 10, Changes: 1000, Expected: 10_000, Delivered: 10_000,
			Delivery: Latency{Count: 10_000, P50: 5, P99: 50}, RSSPerSubscriber: 40 << 10, HeapPerSubscriber: 30 << 10,
			Twice: &Twice{Subscribers: 20_000, Instances: 2000, DialSeconds: 5, RSSPerSubscriber: 70 << 10, HeapPerSubscriber: 11 << 10}},
		Errors: []string{},
	}
	r.Figures = r.figures()
	return r
}

func figure(t *testing.T, figs []Figure, prefix string) Figure {
	t.Helper()
	for _, f := range figs {
		if strings.HasPrefix(f.Name, prefix) {
			return f
		}
	}
	t.Fatalf("no figure %q", prefix)
	return Figure{}
}

func TestFigures(t *testing.T) {
	figs := sampleReport().figures()
	tests := []struct {
		name                     string
		value, target, limit, ra string
		met                      *bool
	}{
		{name: "createInstance, 64 clients: throughput", value: "2,500/s (0 errors of 12,000)", target: "≥ 3,000/s", met: met(false),
			limit: "bare gqlgen 10,000/s", ra: "25.0%"},
		{name: "createInstance, 64 clients: p50", value: "20.0 / 30.0 / 40.0 / 90.0 ms", target: "p99 ≤ 20 ms", met: met(false),
			limit: "bare gqlgen p99 10.0 ms", ra: "4.0×"},
		{name: "createInstance, 64 clients, each round", value: "27.0% / 3.0×, 25.0% / 4.0×, 16.7% / 6.2× (the median share's round is above)"},
		{name: "bare gqlgen `{ ping }`, 64 clients: CPU per request", value: "40 / 30 / 1 µs"},
		{name: "createInstance, 64 clients: CPU per create", value: "80 / 150 / 60 µs", limit: "bare gqlgen 40 / 30 / 1 µs", ra: "6.8×"},
		{name: "2,000 instances", value: "4.00 s (2,000 of 2,000)", target: "≤ 5 s", met: met(true)},
		{name: "converged per second", value: "500/s", limit: "XREADGROUP 20,000/s", ra: "2.5%"},
		{name: "region change → status commit", value: "1.00 / 5.00 ms", limit: "PING 0.050 / 0.100 ms", ra: "20× / 50×"},
		{name: "10,000 subscribers: region change → subscriber", value: "5.00 / 50.0 ms", target: "p99 ≤ 100 ms", met: met(true), ra: "100× / 500×",
			limit: "PING 0.050 / 0.100 ms"},
		{name: "10,000 subscribers: API resident memory per idle subscriber", value: "40.0 KiB", target: "≤ 64.0 KiB", met: met(true), limit: "the target", ra: "62.5%"},
		{name: "10,000 subscribers: API Go heap and stacks per idle subscriber", value: "30.0 KiB", target: "≤ 12.0 KiB", met: met(false), limit: "the target", ra: "250.0%"},
		// At twice the subscribers, from Twice, not the first figures: here the one target
		// met at once the number is missed and the other way round.
		{name: "20,000 subscribers: API resident memory per idle subscriber", value: "70.0 KiB", target: "≤ 64.0 KiB", met: met(false), limit: "the target", ra: "109.4%"},
		{name: "20,000 subscribers: API Go heap and stacks per idle subscriber", value: "11.0 KiB", target: "≤ 12.0 KiB", met: met(true), limit: "the target", ra: "91.7%"},
		{name: "opening the subscriptions", value: "10.0 s (1,000/s)"},
		{name: "20,000 subscribers: opening the 10,000 added", value: "5.0 s (2,000/s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := figure(t, figs, tt.name)
			if f.Value != tt.value || f.Target != tt.target || f.Limit != tt.limit || f.Ratio != tt.ra {
				t.Errorf("got value %q target %q limit %q ratio %q\nwant value %q target %q limit %q ratio %q",
					f.Value, f.Target, f.Limit, f.Ratio, tt.value, tt.target, tt.limit, tt.ra)
			}
			if (f.Met == nil) != (tt.met == nil) || f.Met != nil && *f.Met != *tt.met {
				t.Errorf("met = %v, want %v", f.Met, tt.met)
			}
		})
	}
}

// The median round is the one whose create throughput is the median share of its bare run's,
// whatever either throughput alone: the lower middle one of an even number.
func TestMedianRound(t *testing.T) {
	round := func(bare, create float64) Round {
		return Round{Bare: Load{Throughput: Throughput{PerSecond: bare}}, Create: Load{Throughput: Throughput{PerSecond: create}}}
	}
	tests := []struct {
		name   string
		rounds []Round
		want   int
	}{
		{"one round", []Round{round(100, 30)}, 0},
		{"the middle share, not the middle create throughput", []Round{round(100, 30), round(200, 40), round(50, 20)}, 0},
		{"the middle share, last", []Round{round(100, 40), round(100, 20), round(100, 30)}, 2},
		{"even: the lower middle", []Round{round(100, 40), round(100, 10), round(100, 30), round(100, 20)}, 3},
		{"a bare run that answered nothing ranks lowest", []Round{round(0, 30), round(100, 25), round(100, 35)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := medianRound(tt.rounds); got != tt.want {
				t.Errorf("medianRound = %d, want %d", got, tt.want)
			}
		})
	}
}

// Without the figures at twice the subscribers, the table says why in their place, and has
// neither of their rows.
func TestFiguresTwiceSkipped(t *testing.T) {
	r := sampleReport()
	r.FanOut.Twice, r.FanOut.TwiceSkipped = nil, "the open-file limit is 20,000"
	r.Figures = r.figures()
	figs := r.Figures
	f := figure(t, figs, "20,000 subscribers: API memory per idle subscriber")
	if f.Value != "not measured: the open-file limit is 20,000" || f.Target != "" || f.Met != nil {
		t.Errorf("got value %q target %q met %v, want the reason and no target", f.Value, f.Target, f.Met)
	}
	for _, g := range figs {
		if strings.HasPrefix(g.Name, "20,000 subscribers:") && g != f {
			t.Errorf("figure %q without the measurement", g.Name)
		}
	}
	var md strings.Builder
	if err := r.writeMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "| 20,000 subscribers: API memory per idle subscriber | not measured: the open-file limit is 20,000 |") {
		t.Errorf("markdown lacks the reason:\n%s", md.String())
	}
}

// Targets are the issue's, stated for its sizes: at other sizes a figure has none.
func TestFiguresOtherSizesHaveNoTarget(t *testing.T) {
	r := sampleReport()
	r.Convergence.Instances, r.FanOut.Subscribers = 200, 1000
	figs := r.figures()
	for _, name := range []string{"200 instances", "1,000 subscribers: region change → subscriber"} {
		if f := figure(t, figs, name); f.Target != "" || f.Met != nil {
			t.Errorf("%s: target %q met %v, want none", name, f.Target, f.Met)
		}
	}
}

func TestFiguresTargetsNeedEverything(t *testing.T) {
	r := sampleReport()
	r.Create.Concurrency.Throughput.PerSecond = 4000
	r.Create.Concurrency.Errors = 3 // fast, but not all created
	r.FanOut.Delivered = 9999       // fast, but not all delivered
	r.Convergence.Converged = 1999  // in time, but not all
	figs := r.figures()
	for _, name := range []string{"createInstance, 64 clients: throughput", "10,000 subscribers: region change → subscriber", "2,000 instances"} {
		if f := figure(t, figs, name); f.Met == nil || *f.Met {
			t.Errorf("%s: met = %v, want missed", name, f.Met)
		}
	}
}

func TestRenderings(t *testing.T) {
	r := sampleReport()
	r.Errors = []string{"fan-out: 3 of 10,000 deliveries did not arrive within 1m0s"}
	var text, md strings.Builder
	if err := r.writeText(&text); err != nil {
		t.Fatal(err)
	}
	if err := r.writeMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	sections := []string{"Limits (same Redis, same machine)", "Create (HTTP GraphQL)", "Convergence (zero region delay)", "Propagation", "Fan-out (one API process)"}
	for _, out := range []struct{ name, s string }{{"text", text.String()}, {"markdown", md.String()}} {
		for _, want := range append(sections, "Test CPU, 2 cores", "load average 1.50 at the start, 2.25 at the end",
			"Errors (1):", r.Errors[0], "2,500/s (0 errors of 12,000)") {
			if !strings.Contains(out.s, want) {
				t.Errorf("%s lacks %q:\n%s", out.name, want, out.s)
			}
		}
	}
	for _, want := range []string{"Measured 2026-11-22 09:30 UTC with `computeql bench` against an embedded system.", "| **Create (HTTP GraphQL)** |", "≥ 3,000/s **missed**", "p99 ≤ 100 ms met"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	if !strings.Contains(text.String(), "≥ 3,000/s MISSED") {
		t.Errorf("text does not flag the missed target:\n%s", text.String())
	}
}

func TestWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "docs", "bench")
	r := sampleReport()
	files, err := r.write(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("files = %v", files)
	}
	data, err := os.ReadFile(filepath.Join(dir, "latest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Create.Concurrency.Throughput.PerSecond != 2500 || len(back.Figures) != len(r.Figures) || !back.Date.Equal(r.Date) {
		t.Errorf("JSON does not round-trip: %+v", back)
	}
	md, err := os.ReadFile(filepath.Join(dir, "latest.md"))
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	r.writeMarkdown(&want)
	if string(md) != want.String() {
		t.Errorf("latest.md differs from the Markdown rendering")
	}
}

func TestFormatting(t *testing.T) {
	tests := []struct{ got, want string }{
		{count(0), "0"},
		{count(999), "999"},
		{count(1000), "1,000"},
		{count(1234567.4), "1,234,567"},
		{count(-12345), "-12,345"},
		{msNum(0.0123), "0.012"},
		{msNum(4.567), "4.57"},
		{msNum(45.67), "45.7"},
		{msNum(4567), "4,567"},
		{share(1, 0), "n/a"},
		{times(1, 0), "n/a"},
		{times(25, 10), "2.5×"},
		{times(250, 10), "25×"},
		{kib(1536), "1.5 KiB"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}
