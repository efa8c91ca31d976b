package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is everything one run measured. It is written as JSON, and its Figures as the
// terminal and Markdown tables.
type Report struct {
	Date    time.Time `json:"date"`
	Command string    `json:"command"`
	Machine Machine   `json:"machine"`
	// System says what was measured ("against …"): the embedded processes, or the target.
	System      string      `json:"system"`
	Sizes       Sizes       `json:"sizes"`
	Limits      Limits      `json:"limits"`
	Create      Create      `json:"create"`
	Convergence Convergence `json:"convergence"`
	Propagation Propagation `json:"propagation"`
	FanOut      FanOut      `json:"fanOut"`
	// Profiles lists the profile files written (with --profile).
	Profiles []string `json:"profiles,omitempty"`
	Figures  []Figure `json:"figures"`
	// Errors lists what went wrong; a run with errors exits with a failure.
	Errors []string `json:"errors"`
}

// Machine is where the run ran. Load averages are /proc/loadavg's 1, 5 and 15 minutes: a
// busy machine makes every figure worse, and says so here.
type Machine struct {
	CPU       string     `json:"cpu"`
	Cores     int        `json:"cores"`
	MemoryMiB int64      `json:"memoryMiB"`
	OS        string     `json:"os"`
	Go        string     `json:"go"`
	Redis     string     `json:"redis"`
	LoadStart [3]float64 `json:"loadStart"`
	LoadEnd   [3]float64 `json:"loadEnd"`
	// FileLimit is the benchmark's open-file limit (soft), which its processes inherit.
	FileLimit uint64 `json:"fileLimit"`
}

// Sizes are the settings that shape the load (the Config without its addresses and secret).
type Sizes struct {
	Workers     int     `json:"workers"`
	Duration    string  `json:"duration"`
	Concurrency int     `json:"concurrency"`
	Rounds      int     `json:"rounds"`
	CreateRate  float64 `json:"createRate"`
	Instances   int     `json:"instances"`
	ChurnRate   float64 `json:"churnRate"`
	Probes      int     `json:"probes"`
	ProbeRate   float64 `json:"probeRate"`
	Subscribers int     `json:"subscribers"`
	FanOutRate  float64 `json:"fanOutRate"`
	RedisOps    int     `json:"redisOps"`
	Pings       int     `json:"pings"`
}

func sizesOf(c Config) Sizes {
	return Sizes{
		Workers: c.Workers, Duration: c.Duration.String(), Concurrency: c.Concurrency, Rounds: c.Rounds, CreateRate: c.CreateRate,
		Instances: c.Instances, ChurnRate: c.ChurnRate, Probes: c.Probes, ProbeRate: c.ProbeRate,
		Subscribers: c.Subscribers, FanOutRate: c.FanOutRate, RedisOps: c.RedisOps, Pings: c.Pings,
	}
}

// Create is createInstance over HTTP: at a fixed number of clients, and at a fixed rate.
type Create struct {
	// Concurrency is the closed-loop run of the median round (Rounds[Median]); Limits.Bare is
	// that round's bare run.
	Concurrency Load `json:"concurrency"`
	Rate        Load `json:"rate"`
	// Rounds are the closed-loop runs of the bare handler and of the create, in the order run.
	Rounds []Round `json:"rounds"`
	Median int     `json:"median"`
}

// Round is a closed-loop run of the bare handler and one of the create beside it.
type Round struct {
	Bare   Load `json:"bare"`
	Create Load `json:"create"`
}

func (rd Round) shareOf() float64 {
	if rd.Bare.Throughput.PerSecond <= 0 {
		return 0
	}
	return rd.Create.Throughput.PerSecond / rd.Bare.Throughput.PerSecond
}

// share is the create's throughput as a percentage of the bare handler's.
func (rd Round) share() string {
	return share(rd.Create.Throughput.PerSecond, rd.Bare.Throughput.PerSecond)
}

// p99Multiple is the create's p99 as a multiple of the bare handler's.
func (rd Round) p99Multiple() string { return times(rd.Create.Latency.P99, rd.Bare.Latency.P99) }

// medianRound is the index of the round whose create throughput is the median share of its
// bare run's: the lower of the middle two for an even number.
func medianRound(rounds []Round) int {
	order := make([]int, len(rounds))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(rounds[a].shareOf(), rounds[b].shareOf()) })
	return order[(len(order)-1)/2]
}

// Convergence is the time from sending each create to its instance's RUNNING commit.
type Convergence struct {
	Instances int `json:"instances"`
	Converged int `json:"converged"`
	// Seconds is from the first create sent to the last RUNNING commit.
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"perSecond"`
	Latency   Latency `json:"latency"`
}

// Propagation is the time from a change of a server in the region to the instance's status
// commit and to a subscriber's receipt, for probe changes made among background changes.
type Propagation struct {
	Seconds      float64 `json:"seconds"`
	ChurnChanges int     `json:"churnChanges"`
	ProbeChanges int     `json:"probeChanges"`
	// Commit covers every change, background ones included; Subscriber the probes.
	Commit     Latency `json:"commit"`
	Subscriber Latency `json:"subscriber"`
	Missing    int     `json:"missing"`
}

// FanOut is many subscribers on one API process: what they cost idle, and how fast a change
// reaches all of them.
type FanOut struct {
	Subscribers int     `json:"subscribers"`
	Instances   int     `json:"instances"`
	DialSeconds float64 `json:"dialSeconds"`
	// Before and After are the API process's memory before the subscribers connected and once
	// all were live and idle.
	Before            Memory  `json:"before"`
	After             Memory  `json:"after"`
	RSSPerSubscriber  float64 `json:"rssPerSubscriberBytes"`
	HeapPerSubscriber float64 `json:"heapAndStacksPerSubscriberBytes"`
	Changes           int     `json:"changes"`
	Expected          int     `json:"expectedDeliveries"`
	Delivered         int     `json:"deliveries"`
	Delivery          Latency `json:"delivery"`
	Commit            Latency `json:"commit"`
	// Twice is the API's memory once as many subscribers again joined these, after their
	// deliveries; TwiceSkipped says why it was not measured.
	Twice        *Twice `json:"twice,omitempty"`
	TwiceSkipped string `json:"twiceSkipped,omitempty"`
}

// Twice is the fan-out's idle memory at twice its subscribers: the first ones, idle after
// their deliveries, and as many again on as many other instances, with the figures per
// subscriber from the same baseline (FanOut.Before), over all of them.
type Twice struct {
	Subscribers int `json:"subscribers"`
	Instances   int `json:"instances"`
	// DialSeconds is the opening of the added ones.
	DialSeconds       float64 `json:"dialSeconds"`
	After             Memory  `json:"after"`
	RSSPerSubscriber  float64 `json:"rssPerSubscriberBytes"`
	HeapPerSubscriber float64 `json:"heapAndStacksPerSubscriberBytes"`
}

// Figure is one row of the table: a figure, the target for it, and the best the
// machine does at the same thing (its limit), measured in the same run.
type Figure struct {
	Section string `json:"section"`
	Name    string `json:"name"`
	Value   string `json:"value"`
	Target  string `json:"target,omitempty"`
	// Met is whether the target was met; absent without a target.
	Met   *bool  `json:"met,omitempty"`
	Limit string `json:"limit,omitempty"`
	// Ratio relates the value to the limit: a share for throughputs, a multiple for latencies.
	Ratio string `json:"ratio,omitempty"`
}

// The targets, for this 2-core machine.
const (
	targetCreatePerSecond  = 3000
	targetCreateP99Ms      = 20
	targetConvergeN        = 2000
	targetConvergeSeconds  = 5
	targetSubscriberP99Ms  = 100
	targetSubscribersN     = 10_000
	targetBytesPerIdleSubs = 64 << 10
	// targetHeapPerIdleSub is for the Go heap and stacks alone, which is what the process's
	// own code decides (resident memory also counts what the runtime keeps from the OS).
	targetHeapPerIdleSub = 12 << 10
)

// figures derives the table from the measurements.
func (r *Report) figures() []Figure {
	l, c, cv, p, f := r.Limits, r.Create, r.Convergence, r.Propagation, r.FanOut
	conc := strconv.Itoa(r.Sizes.Concurrency)
	rate := count(r.Sizes.CreateRate) + "/s"
	pingLimit := "PING " + msPair(l.Ping.P50, l.Ping.P99)
	var out []Figure
	add := func(fig Figure) { out = append(out, fig) }

	const lim = "Limits (same Redis, same machine)"
	add(Figure{Section: lim, Name: "Redis PING round trip, p50 / p99", Value: msPair(l.Ping.P50, l.Ping.P99)})
	add(Figure{Section: lim, Name: "XADD, " + conc + " clients", Value: perSecond(l.XAdd.PerSecond)})
	add(Figure{Section: lim, Name: "XREADGROUP of one entry, " + conc + " clients", Value: perSecond(l.XReadGroup.PerSecond)})
	add(Figure{Section: lim, Name: "bare gqlgen `{ ping }`, " + conc + " clients", Value: perSecond(l.Bare.Throughput.PerSecond) + ", p99 " + msOne(l.Bare.Latency.P99)})
	add(Figure{Section: lim, Name: "bare gqlgen `{ ping }`, " + conc + " clients: CPU per request, load generator / handler / Redis", Value: cpuValue(l.Bare.CPU)})
	add(Figure{Section: lim, Name: "bare gqlgen `{ ping }` at " + rate + ", p50 / p99", Value: msPair(l.BareRate.Latency.P50, l.BareRate.Latency.P99)})

	const cr = "Create (HTTP GraphQL)"
	add(Figure{Section: cr, Name: "createInstance, " + conc + " clients: throughput",
		Value:  fmt.Sprintf("%s (%s errors of %s)", perSecond(c.Concurrency.Throughput.PerSecond), count(float64(c.Concurrency.Errors)), count(float64(c.Concurrency.Requests))),
		Target: "≥ " + count(targetCreatePerSecond) + "/s", Met: met(c.Concurrency.Throughput.PerSecond >= targetCreatePerSecond && c.Concurrency.Errors == 0),
		Limit: "bare gqlgen " + perSecond(l.Bare.Throughput.PerSecond), Ratio: share(c.Concurrency.Throughput.PerSecond, l.Bare.Throughput.PerSecond)})
	add(Figure{Section: cr, Name: "createInstance, " + conc + " clients: p50 / p90 / p99 / max", Value: msAll(c.Concurrency.Latency),
		Target: "p99 ≤ " + strconv.Itoa(targetCreateP99Ms) + " ms", Met: met(c.Concurrency.Latency.Count > 0 && c.Concurrency.Latency.P99 <= targetCreateP99Ms),
		Limit: "bare gqlgen p99 " + msOne(l.Bare.Latency.P99), Ratio: times(c.Concurrency.Latency.P99, l.Bare.Latency.P99)})
	if len(c.Rounds) > 1 {
		each := make([]string, len(c.Rounds))
		for i, rd := range c.Rounds {
			each[i] = rd.share() + " / " + rd.p99Multiple()
		}
		add(Figure{Section: cr, Name: "createInstance, " + conc + " clients, each round: share of the bare handler's throughput / p99 multiple",
			Value: strings.Join(each, ", ") + " (the median share's round is above)"})
	}
	add(Figure{Section: cr, Name: "createInstance, " + conc + " clients: CPU per create, load generator / API / Redis", Value: cpuValue(c.Concurrency.CPU),
		Limit: "bare gqlgen " + cpuValue(l.Bare.CPU), Ratio: cpuRatio(c.Concurrency.CPU, l.Bare.CPU)})
	add(Figure{Section: cr, Name: "createInstance at " + rate + " offered: p50 / p90 / p99 / max",
		Value: fmt.Sprintf("%s (%s, %s errors)", msAll(c.Rate.Latency), perSecond(c.Rate.Throughput.PerSecond), count(float64(c.Rate.Errors))),
		Limit: "bare gqlgen p99 " + msOne(l.BareRate.Latency.P99), Ratio: times(c.Rate.Latency.P99, l.BareRate.Latency.P99)})

	const co = "Convergence (zero region delay)"
	all := Figure{Section: co, Name: count(float64(cv.Instances)) + " instances, create → RUNNING, all",
		Value: fmt.Sprintf("%.2f s (%s of %s)", cv.Seconds, count(float64(cv.Converged)), count(float64(cv.Instances)))}
	if cv.Instances == targetConvergeN {
		all.Target = "≤ " + strconv.Itoa(targetConvergeSeconds) + " s"
		all.Met = met(cv.Converged == cv.Instances && cv.Seconds <= targetConvergeSeconds)
	}
	add(all)
	add(Figure{Section: co, Name: "converged per second", Value: perSecond(cv.PerSecond),
		Limit: "XREADGROUP " + perSecond(l.XReadGroup.PerSecond), Ratio: share(cv.PerSecond, l.XReadGroup.PerSecond)})
	add(Figure{Section: co, Name: "per instance, p50 / p99", Value: msPair(cv.Latency.P50, cv.Latency.P99),
		Limit: pingLimit, Ratio: timesPair(cv.Latency, l.Ping)})

	const pr = "Propagation"
	churn := fmt.Sprintf(" (%s/s background changes)", count(r.Sizes.ChurnRate))
	add(Figure{Section: pr, Name: "region change → status commit, p50 / p99" + churn, Value: msPair(p.Commit.P50, p.Commit.P99),
		Limit: pingLimit, Ratio: timesPair(p.Commit, l.Ping)})
	add(Figure{Section: pr, Name: "region change → WebSocket subscriber, p50 / p99" + churn, Value: msPair(p.Subscriber.P50, p.Subscriber.P99),
		Limit: pingLimit, Ratio: timesPair(p.Subscriber, l.Ping)})

	const fo = "Fan-out (one API process)"
	subs := count(float64(f.Subscribers)) + " subscribers"
	deliv := Figure{Section: fo, Name: subs + ": region change → subscriber, p50 / p99", Value: msPair(f.Delivery.P50, f.Delivery.P99),
		Limit: pingLimit, Ratio: timesPair(f.Delivery, l.Ping)}
	if f.Subscribers >= targetSubscribersN {
		deliv.Target = "p99 ≤ " + strconv.Itoa(targetSubscriberP99Ms) + " ms"
		deliv.Met = met(f.Delivery.Count > 0 && f.Delivery.P99 <= targetSubscriberP99Ms && f.Delivered == f.Expected)
	}
	add(deliv)
	add(Figure{Section: fo, Name: subs + ": region change → status commit, p50 / p99", Value: msPair(f.Commit.P50, f.Commit.P99),
		Limit: pingLimit, Ratio: timesPair(f.Commit, l.Ping)})
	add(Figure{Section: fo, Name: "deliveries", Value: fmt.Sprintf("%s of %s, for %s changes", count(float64(f.Delivered)), count(float64(f.Expected)), count(float64(f.Changes)))})
	idle := func(subs string, n int, rss, heap float64) {
		add(Figure{Section: fo, Name: subs + ": API resident memory per idle subscriber", Value: kib(rss),
			Target: "≤ " + kib(targetBytesPerIdleSubs), Met: met(n > 0 && rss <= targetBytesPerIdleSubs),
			Limit: "the target", Ratio: share(rss, targetBytesPerIdleSubs)})
		add(Figure{Section: fo, Name: subs + ": API Go heap and stacks per idle subscriber", Value: kib(heap),
			Target: "≤ " + kib(targetHeapPerIdleSub), Met: met(n > 0 && heap <= targetHeapPerIdleSub),
			Limit: "the target", Ratio: share(heap, targetHeapPerIdleSub)})
	}
	idle(subs, f.Subscribers, f.RSSPerSubscriber, f.HeapPerSubscriber)
	twice := count(float64(2*f.Subscribers)) + " subscribers"
	if tw := f.Twice; tw != nil {
		twice = count(float64(tw.Subscribers)) + " subscribers"
		idle(twice, tw.Subscribers, tw.RSSPerSubscriber, tw.HeapPerSubscriber)
	} else if f.TwiceSkipped != "" {
		add(Figure{Section: fo, Name: twice + ": API memory per idle subscriber", Value: "not measured: " + f.TwiceSkipped})
	}
	add(Figure{Section: fo, Name: "opening the subscriptions", Value: fmt.Sprintf("%.1f s (%s)", f.DialSeconds, perSecond(float64(f.Subscribers)/f.DialSeconds))})
	if tw := f.Twice; tw != nil {
		added := tw.Subscribers - f.Subscribers
		add(Figure{Section: fo, Name: twice + ": opening the " + count(float64(added)) + " added",
			Value: fmt.Sprintf("%.1f s (%s)", tw.DialSeconds, perSecond(float64(added)/tw.DialSeconds))})
	}
	return out
}

func met(ok bool) *bool { return &ok }

// count writes a whole number with thousands separators: 12,345.
func count(f float64) string {
	s := strconv.FormatInt(int64(math.Round(f)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func perSecond(f float64) string {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "n/a"
	}
	return count(f) + "/s"
}

// msNum writes milliseconds with three significant digits or whole milliseconds.
func msNum(v float64) string {
	switch {
	case v < 1:
		return strconv.FormatFloat(v, 'f', 3, 64)
	case v < 10:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case v < 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return count(v)
}

func msOne(v float64) string     { return msNum(v) + " ms" }
func msPair(a, b float64) string { return msNum(a) + " / " + msNum(b) + " ms" }
func msAll(l Latency) string {
	return msNum(l.P50) + " / " + msNum(l.P90) + " / " + msNum(l.P99) + " / " + msNum(l.Max) + " ms"
}
func kib(bytes float64) string       { return strconv.FormatFloat(bytes/1024, 'f', 1, 64) + " KiB" }
func timesPair(v, of Latency) string { return times(v.P50, of.P50) + " / " + times(v.P99, of.P99) }

// share is value as a percentage of limit.
func share(value, limit float64) string {
	if limit <= 0 {
		return "n/a"
	}
	return strconv.FormatFloat(100*value/limit, 'f', 1, 64) + "%"
}

// times is value as a multiple of limit.
func times(value, limit float64) string {
	if limit <= 0 {
		return "n/a"
	}
	m := value / limit
	if m < 10 {
		return strconv.FormatFloat(m, 'f', 1, 64) + "×"
	}
	return count(m) + "×"
}

func targetCell(f Figure) string {
	switch {
	case f.Met == nil:
		return f.Target
	case *f.Met:
		return f.Target + " met"
	}
	return f.Target + " MISSED"
}

// writeText writes the report as the terminal shows it.
func (r *Report) writeText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "\ncomputeql bench — %s\n%s\n\n", r.Date.Format(time.RFC1123), r.machineLine())
	section := ""
	for _, f := range r.Figures {
		if f.Section != section {
			section = f.Section
			fmt.Fprintf(tw, "\n%s\n", section)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", f.Name, f.Value, targetCell(f), f.Limit, f.Ratio)
	}
	r.writeErrors(tw, "")
	return tw.Flush()
}

// writeMarkdown writes the report as docs/performance.md shows it.
func (r *Report) writeMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s with `%s` %s.\n\nMachine: %s.\n\n", r.Date.Format("2006-01-02 15:04 MST"), r.Command, r.System, r.machineLine())
	b.WriteString("| | figure | value | target | limit (same run) | vs limit |\n| --- | --- | --- | --- | --- | --- |\n")
	section := ""
	for _, f := range r.Figures {
		head := ""
		if f.Section != section {
			section, head = f.Section, "**"+f.Section+"**"
		}
		target := targetCell(f)
		if f.Met != nil && !*f.Met {
			target = f.Target + " **missed**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", head, f.Name, f.Value, target, f.Limit, f.Ratio)
	}
	r.writeErrors(&b, "- ")
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Report) writeErrors(w io.Writer, bullet string) {
	if len(r.Errors) == 0 {
		return
	}
	fmt.Fprintf(w, "\nErrors (%d):\n", len(r.Errors))
	for _, e := range r.Errors {
		fmt.Fprintf(w, "%s%s\n", bullet, e)
	}
}

func (r *Report) machineLine() string {
	m := r.Machine
	return fmt.Sprintf("%s, %d cores, %s MiB, %s, %s, Redis %s; load average %.2f at the start, %.2f at the end",
		m.CPU, m.Cores, count(float64(m.MemoryMiB)), m.OS, m.Go, m.Redis, m.LoadStart[0], m.LoadEnd[0])
}

// write writes latest.json and latest.md to dir.
func (r *Report) write(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report directory: %w", err)
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode report: %w", err)
	}
	jsonPath, mdPath := filepath.Join(dir, "latest.json"), filepath.Join(dir, "latest.md")
	if err := os.WriteFile(jsonPath, append(data, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("write report: %w", err)
	}
	var md strings.Builder
	if err := r.writeMarkdown(&md); err != nil {
		return nil, err
	}
	if err := os.WriteFile(mdPath, []byte(md.String()), 0o644); err != nil {
		return nil, fmt.Errorf("write report: %w", err)
	}
	return []string{jsonPath, mdPath}, nil
}

// machine describes this machine, from /proc where Linux has it.
func machine() Machine {
	m := Machine{Cores: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version(), LoadStart: loadAverage()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(data)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(data), "MemTotal: %d kB", &kb); err == nil {
			m.MemoryMiB = kb / 1024
		}
	}
	return m
}

// loadAverage reads /proc/loadavg (zeros where there is none).
func loadAverage() [3]float64 {
	var l [3]float64
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Sscan(string(data), &l[0], &l[1], &l[2])
	}
	return l
}
