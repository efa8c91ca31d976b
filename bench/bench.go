// Package bench is `computeql bench`: a load generator that measures a whole computeql system
// against the best the same machine does, in one run.
//
// It starts a system — a real redis-server on a free loopback port, and this binary's api
// and worker roles as separate processes, so the API's memory is its own — or targets one
// already running (--target, --redis, --token-secret). In order, it measures:
//
//  1. the limits: the Redis round trip, bare XADD and XREADGROUP throughput on the same
//     Redis, and a bare gqlgen handler answering a trivial query over loopback HTTP, in a
//     process of its own as the API is;
//  2. createInstance over HTTP GraphQL at a fixed number of clients, in rounds that alternate
//     with the bare handler's (each create run compared with the bare run beside it, and
//     the median round reported), and at a fixed offered rate, with the API alone (no worker
//     runs, so the figure is the API's);
//  3. convergence: from sending each create to its instance's RUNNING commit;
//  4. propagation: from a change of a server in the simulated region to the instance's status
//     commit and to a WebSocket subscriber, under background changes;
//  5. fan-out: many WebSocket subscribers on a fresh API process, their delivery latency and
//     the process's memory per idle subscriber; then as many again, and its memory per idle
//     subscriber at twice the number.
//
// The embedded system is reset between 2 and 3 (processes stopped, Redis flushed) and the API
// is restarted before 5, so that each starts clean. Progress goes to the terminal while it
// runs; the results go to a table there and to latest.json and latest.md in --out.
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/computeql/computeql/instance"
)

// Main runs `computeql bench` with its arguments (after "bench"), writing progress and the
// results to out.
func Main(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := parseConfig(args, os.LookupEnv, out)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if cfg.ServeBare {
		return serveBareProcess(ctx, os.Stderr)
	}
	if cfg.PrintCatalog {
		data, err := benchCatalog()
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", data)
		return err
	}
	if cfg.Instructions > 0 {
		in, err := countInstructions(ctx, cfg, cfg.Instructions)
		if err != nil {
			return err
		}
		return writeInstructions(out, in)
	}
	return run(ctx, cfg, strings.Join(append([]string{"computeql bench"}, args...), " "), out)
}

// runner is one run: the system, what it measured so far, and what the phases hand on.
type runner struct {
	cfg   Config
	out   io.Writer
	outMu sync.Mutex // progress may come from a phase's ticker
	start time.Time
	sys   *system
	rep   *Report
	where where
	// runID starts the names of the run's instances, so runs against one target never
	// collide.
	runID string
	token string
	// ch records every server change of the run; targets are the converged instances.
	ch      *changes
	targets []target
	// files is what raising the open-file limit came to, at the start of the run.
	files fileLimit
	// bare serves from the limits phase to the end of the create phase.
	bare *bareServer
}

// maxInFlight bounds the requests of a fixed-rate run that are outstanding at once: far more
// than a healthy system needs, few enough that a stalled one does not exhaust ports.
const maxInFlight = 512

func run(ctx context.Context, cfg Config, command string, out io.Writer) (err error) {
	r := &runner{
		cfg: cfg, out: out, start: time.Now(), ch: newChanges(),
		rep:   &Report{Date: time.Now().UTC(), Command: command, Machine: machine(), Sizes: sizesOf(cfg), Errors: []string{}},
		where: cfg.where(),
		runID: "b" + strings.ReplaceAll(uuid.NewString(), "-", "")[:8],
	}
	// Before any process starts: the processes inherit the limit.
	r.files = raiseFileLimit(filesNeeded(cfg.Subscribers), getFileLimit, setFileLimit)
	r.rep.Machine.FileLimit = r.files.Soft
	if r.files.Short != "" {
		r.say("%s: the fan-out at %s subscribers will be skipped", r.files.Short, count(float64(2*cfg.Subscribers)))
	}
	if cfg.Target == "" {
		r.say("starting redis-server")
	}
	if r.sys, err = newSystem(ctx, cfg); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.sys.close()) }()
	defer func() { // a run cut short between the limits and the end of the create phase
		if r.bare != nil {
			err = errors.Join(err, r.bare.stop())
		}
	}()
	if r.token, err = r.sys.token(); err != nil {
		return err
	}
	r.rep.Machine.Redis = redisVersion(ctx, r.sys)
	r.rep.System = r.describe()
	for _, p := range []struct {
		name string
		run  func(context.Context) error
	}{
		{"limits", r.limits}, {"create", r.create}, {"convergence", r.converge},
		{"propagation", r.propagate}, {"fan-out", r.fanOut},
	} {
		if err := p.run(ctx); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
	}
	r.rep.Machine.LoadEnd = loadAverage()
	r.rep.Figures = r.rep.figures()
	if err := r.rep.writeText(out); err != nil {
		return err
	}
	files, err := r.rep.write(cfg.Out)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nwrote %s\n", strings.Join(files, " and "))
	if n := len(r.rep.Errors); n > 0 {
		return fmt.Errorf("the run had %d errors, listed above", n)
	}
	return nil
}

// say prints a line of progress.
func (r *runner) say(format string, args ...any) {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	fmt.Fprintf(r.out, "[%6.1fs] %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

// fail records a problem that spoils a figure but not the run.
func (r *runner) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.rep.Errors = append(r.rep.Errors, msg)
	r.say("ERROR: %s", msg)
}

// every calls fn every period until the returned stop is called: progress during a wait.
func every(period time.Duration, fn func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fn()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func (r *runner) describe() string {
	if r.cfg.Target != "" {
		return "against the system at " + r.cfg.Target + " (Redis " + r.sys.redisURL + ")"
	}
	return fmt.Sprintf("against an embedded system: redis-server on loopback without persistence, one API and %d worker processes of this binary, all on this machine", r.cfg.Workers)
}

func redisVersion(ctx context.Context, s *system) string {
	info, err := s.rdb.Info(ctx, "server").Result()
	if err != nil {
		return "unknown"
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "unknown"
}

// client returns a GraphQL client of the API for up to conns concurrent requests.
func (r *runner) client(conns int) *client {
	return newClient(r.sys.apiURL+"/graphql", r.token, conns)
}

// limits measures what the machine does at best: Redis and a bare gqlgen handler.
func (r *runner) limits(ctx context.Context) error {
	c := r.cfg
	r.say("limits: %s PINGs, then %s XADDs and XREADGROUPs from %d clients", count(float64(c.Pings)), count(float64(c.RedisOps)), c.Concurrency)
	l, err := redisLimits(ctx, r.sys.rdb, "bench:{limits}:"+r.runID+":", c.Pings, c.RedisOps, c.Concurrency)
	if err != nil {
		return err
	}
	r.say("limits: PING %s, XADD %s, XREADGROUP %s", msPair(l.Ping.P50, l.Ping.P99), perSecond(l.XAdd.PerSecond), perSecond(l.XReadGroup.PerSecond))
	// It serves until the create phase is done: its closed-loop runs alternate with the
	// create's there.
	if r.bare, err = startBare(ctx, r.sys); err != nil {
		return err
	}
	r.say("limits: bare gqlgen handler at %s/s for %s", count(c.CreateRate), c.Duration)
	closedLoop(ctx, c.Concurrency, 2*c.Concurrency, 0, r.bare.ping) // connections and caches warm
	l.BareRate = openLoop(ctx, c.CreateRate, c.Duration, maxInFlight, r.bare.ping)
	r.failedRequests("bare gqlgen handler", l.BareRate)
	r.say("limits: bare gqlgen p99 %s at %s/s", msOne(l.BareRate.Latency.P99), count(c.CreateRate))
	r.rep.Limits = l
	return ctx.Err()
}

// bareServer is the bare gqlgen handler's process and a client of it.
type bareServer struct {
	proc   *child
	client *client
}

func startBare(ctx context.Context, sys *system) (*bareServer, error) {
	proc, err := startChild(ctx, sys.exe, "bare-graphql", sys.dir, []string{"bench", "--serve-bare-graphql"}, nil, servingAPI)
	if err != nil {
		return nil, err
	}
	return &bareServer{proc: proc, client: newClient("http://"+proc.addrs[servingAPI]+"/graphql", "", maxInFlight)}, nil
}

func (b *bareServer) ping(ctx context.Context, _ int) error {
	return b.client.post(ctx, "{ ping }", nil, nil)
}

func (b *bareServer) stop() error {
	b.client.close()
	if err := b.proc.stop(); err != nil {
		return fmt.Errorf("bare graphql: %w", err)
	}
	return nil
}

// failedRequests records a load's failures, if it had any.
func (r *runner) failedRequests(what string, l Load) {
	if l.Errors > 0 {
		r.fail("%s: %d of %d requests failed, the first: %s", what, l.Errors, l.Requests, l.FirstError)
	}
}

// create measures createInstance with the API alone: in the embedded system no worker runs
// yet, so the figures are the API's, and the run's many instances are never reconciled. Its
// closed-loop runs alternate with the bare handler's, so that each create run is compared with
// one the machine made beside it, under the same load from elsewhere.
func (r *runner) create(ctx context.Context) error {
	c := r.cfg
	defer func() {
		if r.bare != nil {
			if err := r.bare.stop(); err != nil {
				r.fail("%v", err)
			}
			r.bare = nil
		}
	}()
	if r.sys.embedded {
		r.say("create: starting the API process")
		if err := r.sys.startAPI(ctx); err != nil {
			return err
		}
	}
	gql := r.client(maxInFlight)
	defer gql.close()
	if err := gql.unlimitedQuota(ctx, c.Org); err != nil {
		return err
	}
	named := func(kind string) request {
		return func(ctx context.Context, i int) error {
			_, err := gql.create(ctx, r.where, r.runID+"-"+kind+"-"+strconv.Itoa(i))
			return err
		}
	}
	closedLoop(ctx, c.Concurrency, 2*c.Concurrency, 0, named("warm"))
	rounds := make([]Round, c.Rounds)
	for i := range rounds {
		bare := func() { // the bare handler and the create in turn, nothing else between
			rounds[i].Bare = r.metered(ctx, r.bare.proc, func() Load { return closedLoop(ctx, c.Concurrency, 0, c.Duration, r.bare.ping) })
		}
		create := func() {
			rounds[i].Create = r.metered(ctx, r.sys.api, func() Load { return closedLoop(ctx, c.Concurrency, 0, c.Duration, named("c"+strconv.Itoa(i))) })
		}
		// Every other round runs the create first: each create run adds tens of thousands of
		// instances, and a trend over the rounds then weighs on both orders alike.
		if i%2 == 0 {
			r.say("create: round %d of %d: the bare handler, then the create, %d clients for %s each", i+1, c.Rounds, c.Concurrency, c.Duration)
			bare()
			create()
		} else {
			r.say("create: round %d of %d: the create, then the bare handler, %d clients for %s each", i+1, c.Rounds, c.Concurrency, c.Duration)
			create()
			bare()
		}
		rd := rounds[i]
		// Each round's CPU split too: a trend over the rounds shows which process it is in.
		r.say("create: round %d: bare %s (p99 %s, CPU %s), create %s (p50 / p99 %s, CPU %s): %s of the bare handler's throughput, p99 %s",
			i+1, perSecond(rd.Bare.Throughput.PerSecond), msOne(rd.Bare.Latency.P99), cpuValue(rd.Bare.CPU), perSecond(rd.Create.Throughput.PerSecond),
			msPair(rd.Create.Latency.P50, rd.Create.Latency.P99), cpuValue(rd.Create.CPU), rd.share(), rd.p99Multiple())
		r.failedRequests("bare gqlgen handler", rd.Bare)
		r.failedRequests("create", rd.Create)
	}
	if r.cfg.Profile != "" && r.sys.api != nil {
		// A run of its own: the profiler's cost is in no figure the rounds report.
		r.say("create: profiling the API over one more create run of %s", c.Duration)
		prof := r.startProfile(ctx, "create", r.sys.api)
		closedLoop(ctx, c.Concurrency, 0, c.Duration, named("p"))
		prof()
	}
	m := medianRound(rounds)
	r.rep.Create.Rounds, r.rep.Create.Median = rounds, m
	r.rep.Limits.Bare, r.rep.Create.Concurrency = rounds[m].Bare, rounds[m].Create
	r.say("create: %s/s offered for %s", count(c.CreateRate), c.Duration)
	r.rep.Create.Rate = openLoop(ctx, c.CreateRate, c.Duration, maxInFlight, named("r"))
	r.say("create: p50 / p99 %s at %s/s", msPair(r.rep.Create.Rate.Latency.P50, r.rep.Create.Rate.Latency.P99), count(c.CreateRate))
	r.failedRequests("create", r.rep.Create.Rate)
	return ctx.Err()
}

// converge creates the run's instances and times each to its RUNNING commit. In the embedded
// system it first starts afresh, now with the workers.
func (r *runner) converge(ctx context.Context) error {
	c := r.cfg
	if r.sys.embedded {
		r.say("convergence: resetting; starting the API and %d worker processes", c.Workers)
		if err := r.sys.reset(ctx); err != nil {
			return err
		}
		if err := r.sys.startAPI(ctx); err != nil {
			return err
		}
		if err := r.sys.startWorkers(ctx); err != nil {
			return err
		}
	}
	gql := r.client(c.Concurrency)
	defer gql.close()
	if err := gql.unlimitedQuota(ctx, c.Org); err != nil {
		return err
	}
	// One instance through the whole path first: the workers and the region's clock run.
	if _, _, err := r.createAndWait(ctx, gql, 1, "ready"); err != nil {
		return fmt.Errorf("the system did not run a first instance: %w", err)
	}
	r.say("convergence: creating %s instances from %d clients", count(float64(c.Instances)), c.Concurrency)
	var worker *child
	if len(r.sys.workers) > 0 {
		worker = r.sys.workers[0]
	}
	prof := r.startProfile(ctx, "converge.worker", worker)
	res, ids, err := r.createAndWait(ctx, gql, c.Instances, "v")
	prof()
	if err != nil {
		return err
	}
	r.rep.Convergence = res
	r.say("convergence: %s of %s RUNNING in %.2f s (%s), per instance p50 / p99 %s", count(float64(res.Converged)),
		count(float64(res.Instances)), res.Seconds, perSecond(res.PerSecond), msPair(res.Latency.P50, res.Latency.P99))
	scope, err := r.sys.scope()
	if err != nil {
		return err
	}
	if r.targets, err = servers(ctx, r.sys.region, scope, ids); err != nil {
		return err
	}
	if len(r.targets) < c.Instances {
		return fmt.Errorf("only %d of %d instances converged: too few to change", len(r.targets), c.Instances)
	}
	return nil
}

// arrivals collects when instances were first seen RUNNING, and counts those of them that
// the benchmark created and waits for.
type arrivals struct {
	mu      sync.Mutex
	running map[string]time.Time
	wanted  map[string]bool
	t       *tally
}

func (a *arrivals) ran(id string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, seen := a.running[id]; seen {
		return
	}
	a.running[id] = at
	if a.wanted[id] {
		a.t.receive()
	}
}

// want adds a created instance, which may have run already.
func (a *arrivals) want(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.wanted[id] = true
	a.t.expect(1)
	if _, seen := a.running[id]; seen {
		a.t.receive()
	}
}

// createAndWait creates n instances and waits until each has run; it returns the timings and
// the ids of the instances that ran, in creation order.
func (r *runner) createAndWait(ctx context.Context, gql *client, n int, kind string) (Convergence, []string, error) {
	a := &arrivals{running: map[string]time.Time{}, wanted: map[string]bool{}, t: newTally()}
	tl, err := startTail(ctx, r.sys.store, r.cfg.Org, func(rec *instance.Record, at time.Time) {
		if rec.Instance.Status.PowerState == instance.PowerRunning {
			a.ran(rec.Instance.ID, at)
		}
	})
	if err != nil {
		return Convergence{}, nil, err
	}
	sent := make([]time.Time, n)
	ids := make([]string, n)
	start := time.Now()
	load := closedLoop(ctx, r.cfg.Concurrency, n, 0, func(ctx context.Context, i int) error {
		sent[i] = time.Now()
		id, err := gql.create(ctx, r.where, r.runID+"-"+kind+"-"+strconv.Itoa(i))
		if err != nil {
			return err
		}
		ids[i] = id
		a.want(id)
		return nil
	})
	if load.Errors > 0 {
		r.fail("convergence: %d of %d creates failed, the first: %s", load.Errors, n, load.FirstError)
	}
	a.t.seal()
	stop := every(2*time.Second, func() {
		got, _ := a.t.counts()
		r.say("convergence: %s of %s RUNNING", count(float64(got)), count(float64(n)))
	})
	missing := a.t.wait(ctx, r.cfg.Timeout, tl.failed)
	stop()
	if err := errors.Join(tl.stop(), ctx.Err()); err != nil {
		return Convergence{}, nil, err
	}
	if missing > 0 {
		r.fail("convergence: %d of %d instances not RUNNING within %s", missing, n, r.cfg.Timeout)
	}
	res := Convergence{Instances: n}
	var lat []time.Duration
	var ran []string
	var last time.Time
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, id := range ids {
		at, ok := a.running[id]
		if id == "" || !ok {
			continue
		}
		ran = append(ran, id)
		lat = append(lat, at.Sub(sent[i]))
		if at.After(last) {
			last = at
		}
	}
	res.Converged, res.Latency = len(ran), summarize(lat)
	if len(ran) > 0 {
		res.Seconds = last.Sub(start).Seconds()
		res.PerSecond = float64(len(ran)) / res.Seconds
	}
	return res, ran, nil
}

// receiver times the changes one receiver of events — the event log, or a subscriber — sees
// of its instances, and counts each on a tally.
type receiver struct {
	ch   *changes
	t    *tally
	mu   sync.Mutex
	next map[string]int
	lat  []time.Duration
}

// newReceiver follows the instances from the changes made so far on.
func newReceiver(ch *changes, t *tally, ids ...string) *receiver {
	rc := &receiver{ch: ch, t: t, next: make(map[string]int, len(ids))}
	for _, id := range ids {
		rc.next[id] = ch.count(id)
	}
	return rc
}

func (rc *receiver) see(id, health string, at time.Time) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n, ok := rc.next[id]
	if !ok {
		return
	}
	if d, ok := rc.ch.match(id, &n, health, at); ok {
		rc.next[id] = n
		rc.lat = append(rc.lat, d)
		rc.t.receive()
	}
}

func (rc *receiver) latencies() []time.Duration {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.lat
}

// watchCommits follows the event log with a receiver of the instances' changes.
func (r *runner) watchCommits(ctx context.Context, t *tally, ids []string) (*receiver, *tail, error) {
	rc := newReceiver(r.ch, t, ids...)
	tl, err := startTail(ctx, r.sys.store, r.cfg.Org, func(rec *instance.Record, at time.Time) {
		rc.see(rec.Instance.ID, string(rec.Instance.Status.HealthStatus), at)
	})
	return rc, tl, err
}

// subscribe opens n subscribers, subscriber i to instance ids[i%len(ids)], each with its
// own receiver counting on t.
func (r *runner) subscribe(ctx context.Context, ids []string, n int, t *tally, label string) ([]*subscriber, []*receiver, error) {
	ws, err := wsURL(r.sys.apiURL)
	if err != nil {
		return nil, nil, err
	}
	rcs := make([]*receiver, n)
	var mu sync.Mutex
	opened := 0
	stop := every(2*time.Second, func() {
		mu.Lock()
		defer mu.Unlock()
		r.say("%s: %s of %s subscribers live", label, count(float64(opened)), count(float64(n)))
	})
	defer stop()
	subs, err := dialAll(ctx, n, r.cfg.Concurrency, func(ctx context.Context, i int) (*subscriber, error) {
		id := ids[i%len(ids)]
		rc := newReceiver(r.ch, t, id)
		rcs[i] = rc
		return dialSubscriber(ctx, ws, r.token, r.cfg.Org, id, func(ev event, at time.Time) {
			rc.see(ev.Instance.ID, ev.Instance.Status.HealthStatus, at)
		})
	}, func(done int) {
		mu.Lock()
		defer mu.Unlock()
		opened = done
	})
	return subs, rcs, err
}

func merged(rcs []*receiver) []time.Duration {
	var all []time.Duration
	for _, rc := range rcs {
		all = append(all, rc.latencies()...)
	}
	return all
}

// propagate times changes of probe instances, each watched by one subscriber, while the
// other instances' servers change in the background.
func (r *runner) propagate(ctx context.Context) error {
	c := r.cfg
	probes, churn := r.targets[:c.Probes], r.targets[c.Probes:]
	probeIDs, allIDs := instanceIDs(probes), instanceIDs(r.targets)
	commitT, subT := newTally(), newTally()
	commits, tl, err := r.watchCommits(ctx, commitT, allIDs)
	if err != nil {
		return err
	}
	r.say("propagation: %d subscribers, one per probe instance", len(probes))
	subs, rcs, err := r.subscribe(ctx, probeIDs, len(probes), subT, "propagation")
	if err != nil {
		return errors.Join(err, tl.stop())
	}
	isProbe := make(map[string]bool, len(probes))
	for _, id := range probeIDs {
		isProbe[id] = true
	}
	expect := func(id string) {
		commitT.expect(1)
		if isProbe[id] {
			subT.expect(1)
		}
	}
	r.say("propagation: %s/s probe changes and %s/s background changes for %s", count(c.ProbeRate), count(c.ChurnRate), c.Duration)
	var wg sync.WaitGroup
	var probeN, churnN int
	var probeErr, churnErr error
	start := time.Now()
	wg.Go(func() { probeN, probeErr = flip(ctx, r.sys.region, probes, c.ProbeRate, c.Duration, r.ch, expect) })
	wg.Go(func() { churnN, churnErr = flip(ctx, r.sys.region, churn, c.ChurnRate, c.Duration, r.ch, expect) })
	wg.Wait()
	commitT.seal()
	subT.seal()
	missing := commitT.wait(ctx, c.Timeout, tl.failed) + subT.wait(ctx, c.Timeout, tl.failed)
	p := Propagation{Seconds: time.Since(start).Seconds(), ProbeChanges: probeN, ChurnChanges: churnN, Missing: missing,
		Commit: summarize(commits.latencies()), Subscriber: summarize(merged(rcs))}
	if err := errors.Join(probeErr, churnErr, closeAll(subs), tl.stop(), ctx.Err()); err != nil {
		return err
	}
	if missing > 0 {
		r.fail("propagation: %d commits or deliveries did not arrive within %s", missing, c.Timeout)
	}
	r.rep.Propagation = p
	r.say("propagation: change → commit %s, → subscriber %s", msPair(p.Commit.P50, p.Commit.P99), msPair(p.Subscriber.P50, p.Subscriber.P99))
	return nil
}

func instanceIDs(ts []target) []string {
	ids := make([]string, len(ts))
	for i, t := range ts {
		ids[i] = t.instance
	}
	return ids
}

// fanOut opens the subscribers on a fresh API process, measures what they cost it idle, then
// changes their instances' servers and times every delivery; then it measures what twice as
// many cost it idle (fanOutTwice).
func (r *runner) fanOut(ctx context.Context) error {
	c := r.cfg
	if r.sys.embedded {
		r.say("fan-out: restarting the API process, so that its memory is measured from fresh")
		if err := r.sys.startAPI(ctx); err != nil {
			return err
		}
	}
	n := int(math.Ceil(float64(c.Subscribers) / subscribersPerInstance))
	ts := r.targets[:n]
	ids := instanceIDs(ts)
	f := FanOut{Subscribers: c.Subscribers, Instances: n}
	var err error
	if f.Before, err = r.sys.apiMemory(ctx); err != nil {
		return err
	}
	subT := newTally()
	r.say("fan-out: opening %s subscribers, %d per instance", count(float64(c.Subscribers)), subscribersPerInstance)
	start := time.Now()
	subs, rcs, err := r.subscribe(ctx, ids, c.Subscribers, subT, "fan-out")
	if err != nil {
		return err
	}
	f.DialSeconds = time.Since(start).Seconds()
	perInstance := map[string]int{}
	for i := range c.Subscribers {
		perInstance[ids[i%n]]++
	}
	if f.After, err = r.sys.apiMemory(ctx); err != nil {
		return errors.Join(err, closeAll(subs))
	}
	f.RSSPerSubscriber, f.HeapPerSubscriber = perSubscriber(f.Before, f.After, c.Subscribers)
	r.say("fan-out: %s subscribers live in %.1f s; API resident memory +%s each", count(float64(c.Subscribers)), f.DialSeconds, kib(f.RSSPerSubscriber))
	r.snapshotProfile(ctx, "fanout", "heap", r.sys.api)

	commitT := newTally()
	commits, tl, err := r.watchCommits(ctx, commitT, ids)
	if err != nil {
		return errors.Join(err, closeAll(subs))
	}
	r.say("fan-out: %s/s changes for %s", count(c.FanOutRate), c.Duration)
	prof := r.startProfile(ctx, "fanout", r.sys.api)
	f.Changes, err = flip(ctx, r.sys.region, ts, c.FanOutRate, c.Duration, r.ch, func(id string) {
		commitT.expect(1)
		subT.expect(perInstance[id])
	})
	commitT.seal()
	subT.seal()
	missing, missingCommits := subT.wait(ctx, c.Timeout, tl.failed), commitT.wait(ctx, c.Timeout, tl.failed)
	prof()
	f.Delivery, f.Commit = summarize(merged(rcs)), summarize(commits.latencies())
	f.Delivered, f.Expected = subT.counts()
	if err := errors.Join(err, tl.stop(), ctx.Err()); err != nil {
		return errors.Join(err, closeAll(subs))
	}
	if missing > 0 {
		r.fail("fan-out: %d of %d deliveries did not arrive within %s", missing, f.Expected, c.Timeout)
	}
	if missingCommits > 0 {
		r.fail("fan-out: %d of %d status commits did not arrive within %s", missingCommits, f.Changes, c.Timeout)
	}
	r.say("fan-out: change → subscriber %s over %s deliveries", msPair(f.Delivery.P50, f.Delivery.P99), count(float64(f.Delivered)))
	// The first subscribers stay open while as many again join them.
	err = r.fanOutTwice(ctx, &f)
	if err = errors.Join(err, closeAll(subs)); err != nil {
		return err
	}
	r.rep.FanOut = f
	return nil
}

// fanOutTwice opens as many subscribers again as the fan-out's, ten on each of as many other
// instances, while the first are still open (idle, their deliveries done), and measures the
// API's memory per idle subscriber at twice the number, from the same baseline as at once the
// number. It closes the ones it opened. A limit that keeps it from running is said in f, as
// is a failure to open them (which is also an error of the run, but not the end of it); the
// context's end, a failure to read the memory and the added subscribers' failures are
// returned.
func (r *runner) fanOutTwice(ctx context.Context, f *FanOut) error {
	c := r.cfg
	total := 2 * c.Subscribers
	switch {
	case r.files.Short != "":
		f.TwiceSkipped = r.files.Short
	case len(r.targets) < 2*f.Instances:
		f.TwiceSkipped = fmt.Sprintf("%s subscribers, ten on each instance, need %s instances and the run has %s (--instances)",
			count(float64(total)), count(float64(2*f.Instances)), count(float64(len(r.targets))))
	}
	if f.TwiceSkipped != "" {
		r.say("fan-out: not measured at %s subscribers: %s", count(float64(total)), f.TwiceSkipped)
		return nil
	}
	ts := r.targets[f.Instances : 2*f.Instances]
	r.say("fan-out: opening %s more subscribers, %d per instance on %s other instances", count(float64(c.Subscribers)),
		subscribersPerInstance, count(float64(len(ts))))
	start := time.Now()
	subs, _, err := r.subscribe(ctx, instanceIDs(ts), c.Subscribers, newTally(), "fan-out")
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		f.TwiceSkipped = "opening the subscribers failed: " + err.Error()
		r.fail("fan-out at %s subscribers: %v", count(float64(total)), err)
		return nil
	}
	tw := &Twice{Subscribers: total, Instances: 2 * f.Instances, DialSeconds: time.Since(start).Seconds()}
	if tw.After, err = r.sys.apiMemory(ctx); err != nil {
		return errors.Join(err, closeAll(subs))
	}
	tw.RSSPerSubscriber, tw.HeapPerSubscriber = perSubscriber(f.Before, tw.After, total)
	f.Twice = tw
	r.say("fan-out: %s subscribers live; API resident memory +%s, Go heap and stacks +%s each", count(float64(total)),
		kib(tw.RSSPerSubscriber), kib(tw.HeapPerSubscriber))
	return closeAll(subs)
}

// perSubscriber is what n subscribers cost the API each, from its memory before any and
// with all of them: resident, and Go heap and stacks.
func perSubscriber(before, after Memory, n int) (rss, heap float64) {
	return float64(after.RSS-before.RSS) / float64(n), float64(after.Heap+after.Stacks-before.Heap-before.Stacks) / float64(n)
}

// startProfile starts a CPU profile of the process for the length of a run (with
// --profile); the returned function waits for it, then takes the allocation profile. Files
// are named name.cpu.pprof and name.allocs.pprof.
func (r *runner) startProfile(ctx context.Context, name string, of *child) (wait func()) {
	if r.cfg.Profile == "" || of == nil {
		return func() {}
	}
	seconds := int(math.Ceil(r.cfg.Duration.Seconds()))
	var wg sync.WaitGroup
	var err error
	wg.Go(func() {
		err = r.fetchProfile(ctx, of, name+".cpu.pprof", "profile?seconds="+strconv.Itoa(seconds), time.Duration(seconds)*time.Second)
	})
	return func() {
		wg.Wait()
		if err != nil {
			r.fail("profile: %v", err)
		}
		r.snapshotProfile(ctx, name, "allocs", of)
	}
}

// snapshotProfile saves one of the process's profiles that need no duration (heap, allocs),
// with --profile.
func (r *runner) snapshotProfile(ctx context.Context, name, kind string, of *child) {
	if r.cfg.Profile == "" || of == nil {
		return
	}
	if err := r.fetchProfile(ctx, of, name+"."+kind+".pprof", kind, 0); err != nil {
		r.fail("profile: %v", err)
	}
}

// fetchProfile saves a profile of the process that takes up to length to make.
func (r *runner) fetchProfile(ctx context.Context, of *child, file, path string, length time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, length+time.Minute)
	defer cancel()
	if err := os.MkdirAll(r.cfg.Profile, 0o755); err != nil {
		return fmt.Errorf("profile directory: %w", err)
	}
	dst := filepath.Join(r.cfg.Profile, file)
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	err = get(ctx, "http://"+of.addrs[servingPprof]+"/debug/pprof/"+path, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	r.rep.Profiles = append(r.rep.Profiles, dst)
	return nil
}
