package chaos

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/store"
)

func TestMain(m *testing.M) { harness.Main(m) }

// SizeEnv chooses the configuration: small (the default, what make test runs) or full (make
// chaos).
const SizeEnv = "COMPUTEQL_CHAOS"

// size is one configuration of the scenarios. Loads are mutations (creates, updates and
// deletes together) sent at a rate, so that faults land in the middle of them.
type size struct {
	name string
	// worker kills
	killOps     int
	killRate    float64
	killEvery   time.Duration
	restartOps  int // each Redis restart
	apiOps      int
	apiRate     float64 // slow enough that resuming every subscriber happens mid-load
	subscribers int     // on the restarted API
	faultOps    int
	// deleteEvery is how often a server is deleted behind the workers' backs.
	deleteEvery time.Duration
	blipOps     int
	blips       int
	rate        float64 // the rate of every load but the worker kills'
}

var sizes = map[string]size{
	"small": {name: "small", killOps: 150, killRate: 10, killEvery: 3 * time.Second, restartOps: 120, apiOps: 100, apiRate: 5, subscribers: 50,
		faultOps: 120, deleteEvery: 2 * time.Second, blipOps: 120, blips: 2, rate: 10},
	"full": {name: "full", killOps: 1000, killRate: 20, killEvery: 4 * time.Second, restartOps: 500, apiOps: 300, apiRate: 3, subscribers: 500,
		faultOps: 500, deleteEvery: time.Second, blipOps: 500, blips: 4, rate: 15},
}

func sizeOf(t *testing.T) size {
	name := os.Getenv(SizeEnv)
	if name == "" {
		name = "small"
	}
	s, ok := sizes[name]
	if !ok {
		t.Fatalf("%s=%q: want small or full", SizeEnv, name)
	}
	return s
}

// Limits are far above what a step needs on a loaded two-core machine, so that failing one
// means the step did not happen, not that it was slow. settleLimit covers the queue's lease
// (30 s: the messages a killed worker held are reclaimed only after it) and the resync's
// interval (30 s: it re-enqueues work whose message Redis lost), twice over.
const (
	stepLimit   = 60 * time.Second
	settleLimit = 180 * time.Second
	// buildDelay keeps servers building long enough for faults to catch them mid-build.
	buildDelay = "200ms"
)

// env is one scenario's deployment, load and observers.
type env struct {
	t       *testing.T
	started time.Time
	redis   *harness.Redis
	d       *harness.Deployment
	apis    []*harness.Process
	workers []*harness.Process
	clients []*harness.Client // admin clients, one per API
	ledger  *Ledger
	checker *Checker
	// watchers follow every organization and one project of each, spread over the APIs.
	watchers []*Watcher
	tokens   map[string]string // viewer token by scope
	// violations is what the final check found: 0, or the test failed.
	violations int
}

type envOptions struct {
	apis, workers int
	workerArgs    []string
	// firstAPIArgs are flags of the first API only.
	firstAPIArgs []string
	failPrefix   string
}

// newEnv starts the deployment on r, raises the quotas so that the load is never refused,
// creates one seed instance in each project and waits until they run, then starts the
// watchers after the newest event of each organization: from then on, every event is owed
// to them.
func newEnv(t *testing.T, r *harness.Redis, o envOptions) *env {
	e := &env{t: t, started: time.Now(), redis: r, ledger: NewLedger(), tokens: map[string]string{}}
	e.d = harness.NewDeployment(t, r, harness.Options{Args: []string{"--build-delay", buildDelay, "--rate-limit", "-1",
		// Every subscriber of a scenario is the same principal.
		"--max-sockets-per-principal", "1000000", "--max-subscriptions-per-principal", "1000000"}})
	for i := range o.apis {
		var args []string
		if i == 0 {
			args = o.firstAPIArgs
		}
		e.apis = append(e.apis, e.d.API(t, args...))
	}
	for range o.workers {
		e.workers = append(e.workers, e.d.Worker(t, o.workerArgs...))
	}
	admin := e.d.Token(t, "--subject", "chaos-admin", "--grant", "acme=admin", "--grant", "globex=admin")
	for _, api := range e.apis {
		e.clients = append(e.clients, api.Client(t, admin))
	}
	e.checker = &Checker{API: e.clients[len(e.clients)-1], Redis: r.Client, Organizations: Organizations, Ledger: e.ledger}
	if o.failPrefix != "" {
		e.checker.FailsToBuild = func(name string) bool { return strings.HasPrefix(name, o.failPrefix) }
	}
	ctx, cancel := context.WithTimeout(context.Background(), stepLimit)
	defer cancel()
	for _, org := range Organizations {
		setQuota(ctx, t, e.clients[0], org, 2000)
	}
	seeds := &Load{Clients: e.clients[:1], Ledger: e.ledger, Names: "seed", Ops: len(Projects), Rate: 50, Actors: 1}
	seeds.Run(ctx)
	e.checker.Settle(t, stepLimit)
	for i, scope := range []struct{ org, project string }{{"acme", ""}, {"globex", "prod"}, {"acme", "web"}, {"globex", ""}} {
		e.watchers = append(e.watchers, e.watch(e.apis[i%len(e.apis)], scope.org, scope.project))
	}
	e.logf("deployment of %d APIs and %d workers up, %d seeds running", len(e.apis), len(e.workers), len(Projects))
	return e
}

// watch starts a watcher of the scope on the API, after the organization's newest event.
func (e *env) watch(api *harness.Process, org, project string) *Watcher {
	t := e.t
	t.Helper()
	scope := org
	if project != "" {
		scope += "/" + project
	}
	token, ok := e.tokens[scope]
	if !ok {
		token = e.d.Token(t, "--subject", "chaos-viewer", "--grant", scope+"=viewer")
		e.tokens[scope] = token
	}
	last, err := store.New(e.redis.Client).LastEvent(context.Background(), org)
	if err != nil {
		t.Fatal(err)
	}
	w := &Watcher{API: api, Token: token, Org: org, Project: project, Start: instance.EventCursor(instance.Record{Cursor: last})}
	w.Subscribe(t)
	return w
}

func (e *env) logf(format string, args ...any) {
	e.t.Helper()
	e.t.Logf("%6.1fs: "+format, append([]any{time.Since(e.started).Seconds()}, args...)...)
}

func setQuota(ctx context.Context, t *testing.T, c *harness.Client, org string, servers int) {
	t.Helper()
	if err := c.SetQuota(ctx, org, map[string]int{"servers": servers, "publicIPs": servers, "cpus": 4 * servers, "memoryGiB": 16 * servers}); err != nil {
		t.Fatal(err)
	}
}

// load runs the load in the background; the returned channel is closed when it finished.
// at maps fractions of the load (e.g. 0.5) to channels closed once that share was answered,
// so that faults are injected mid-load by evidence rather than by timing.
func (e *env) load(l *Load, at ...float64) (done chan struct{}, reached []chan struct{}) {
	l.Clients, l.Ledger = e.clients, e.ledger
	reached = make([]chan struct{}, len(at))
	once := make([]sync.Once, len(at))
	for i := range at {
		reached[i] = make(chan struct{})
	}
	l.Progress = func(answered int) {
		for i, f := range at {
			if answered >= int(f*float64(l.Ops)) {
				once[i].Do(func() { close(reached[i]) })
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleLimit+time.Duration(float64(l.Ops)/l.Rate*float64(2*time.Second)))
	done = make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		l.Run(ctx)
	}()
	e.t.Cleanup(func() { cancel(); <-done })
	return done, reached
}

// await waits for the load to finish or to reach a mark; one it does not reach within
// settleLimit fails the test.
func (e *env) await(what string, ch <-chan struct{}) {
	e.t.Helper()
	select {
	case <-ch:
	case <-time.After(settleLimit):
		e.t.Fatalf("%s did not happen within %s", what, settleLimit)
	}
}

// finish checks the scenario's outcome: every process still alive (or restarted), the
// deployment settled with every invariant holding, every watcher caught up and its events
// equal to the log's. It returns the final state.
func (e *env) finish(l *Load) *State {
	t := e.t
	t.Helper()
	e.d.Alive(t)
	counts := l.Counts()
	e.logf("load answered: %s", describeCounts(counts))
	state := e.checker.Settle(t, settleLimit)
	e.logf("settled: %d instances, %d servers, %d dead letters, every invariant holds", len(state.Instances), len(state.Servers), len(state.DeadLetters))
	// The final check, on a fresh read: every invariant, and every watcher against the log as
	// it is in this read, up to its last event.
	ctx, cancel := context.WithTimeout(context.Background(), stepLimit)
	defer cancel()
	final, err := e.checker.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	violations := e.checker.Check(final)
	resumed, events, lostSeen := 0, 0, 0
	for _, w := range e.watchers {
		want, err := Expected(final.Log[w.Org], w.Project, w.Start)
		if err != nil {
			t.Fatal(err)
		}
		got := w.Received(t)
		if len(want) > 0 {
			tail := instance.EventCursor(want[len(want)-1])
			w.CatchUp(ctx, t, tail)
			got = upTo(t, w.Received(t), tail)
		}
		n, err := CheckReceived(got, want, e.checker.Lost)
		if err != nil {
			violations = append(violations, fmt.Errorf("%v (resumed %d times): %w", w, w.Resumes, err))
		}
		lostSeen += n
		events += len(got)
		if w.Resumes > 0 {
			resumed++
		}
	}
	e.violations = len(violations)
	if len(violations) > 0 {
		t.Fatalf("%d invariant violations:\n%s", len(violations), summarize(violations))
	}
	e.logf("%d subscribers (%d resumed with their cursor) received %d events, each exactly the log of its scope (%d lost with Redis, seen before the loss)",
		len(e.watchers), resumed, events, lostSeen)
	return final
}

// upTo returns the events received up to the one at cursor: what came later is not in the
// log the check read.
func upTo(t *testing.T, got []Seen, cursor string) []Seen {
	tail := position(t, cursor)
	for i, g := range got {
		if instance.PositionLess(tail, position(t, g.Cursor)) {
			return got[:i]
		}
	}
	return got
}

// report logs the scenario's row of the reliability table of docs/reliability.md.
func (e *env) report(scenario string, l *Load, faults string) {
	e.t.Logf("REPORT | %s | %s | %s | %d |", scenario, loadSummary(l.Counts()), faults, e.violations)
}

func describeCounts(c map[OpKind]map[Outcome]int) string {
	var parts []string
	for _, k := range OpKinds {
		part := string(k) + "s:"
		for _, o := range []Outcome{Acked, Refused, NotFound, Unknown} {
			if n := c[k][o]; n > 0 {
				part += fmt.Sprintf(" %d %v", n, o)
			}
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, "; ")
}

// loadSummary is the report's load column.
func loadSummary(c map[OpKind]map[Outcome]int) string {
	total := 0
	for _, byOutcome := range c {
		for _, n := range byOutcome {
			total += n
		}
	}
	return fmt.Sprintf("%d mutations (%d creates, %d updates, %d resizes, %d deletes)", total, sum(c[OpCreate]), sum(c[OpUpdate]), sum(c[OpResize]), sum(c[OpDelete]))
}

func sum(m map[Outcome]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// metric sums a counter or gauge, over all its labels, from the processes' /metrics.
func (e *env) metric(name string, procs ...*harness.Process) float64 {
	t := e.t
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	total := 0.0
	for _, p := range procs {
		resp, err := client.Get(p.URL() + "/metrics")
		if err != nil {
			t.Fatalf("metrics of %s: %v", p.Name, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("metrics of %s: %v", p.Name, err)
		}
		for line := range strings.SplitSeq(string(body), "\n") {
			series, value, ok := strings.Cut(line, " ")
			if !ok || (series != name && !strings.HasPrefix(series, name+"{")) {
				continue
			}
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatalf("metrics of %s: %q: %v", p.Name, line, err)
			}
			total += v
		}
	}
	return total
}
