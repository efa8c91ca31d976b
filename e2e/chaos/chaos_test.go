package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
)

// hold lets a fault last for d: the length of an outage is what the scenario injects, not a
// wait for something to happen.
func hold(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	<-t.C
}

// TestChaosWorkerKills kills a worker with SIGKILL every few seconds, each time at a moment
// it holds work (queue messages delivered to it and not finished), and restarts it, while
// creates, updates (half of them rebuilds) and deletes go on. The messages a killed worker
// held stay pending until their lease runs out and the other worker reclaims them: nothing
// may be lost, duplicated or left half done.
func TestChaosWorkerKills(t *testing.T) {
	t.Parallel()
	sz := sizeOf(t)
	e := newEnv(t, harness.StartRedis(t), envOptions{apis: 1, workers: 2})
	leased := e.leases(4, 2*sz.killEvery)
	l := &Load{Ops: sz.killOps, Rate: sz.killRate}
	done, _ := e.load(l)
	kills, held := 0, int64(0)
	ticker := time.NewTicker(sz.killEvery)
	defer ticker.Stop()
kill:
	for {
		select {
		case <-done:
			break kill
		case <-ticker.C:
		}
		victim := e.workers[kills%len(e.workers)]
		n := e.awaitHolding(victim, done)
		if n == 0 {
			break kill // the load finished first
		}
		victim.Kill(t)
		kills, held = kills+1, held+n
		victim.Restart(t)
	}
	e.logf("%d workers killed, holding %d messages in all", kills, held)
	if kills == 0 {
		t.Fatal("no worker was killed: the load ended before the first kill")
	}
	e.finish(l)
	e.logf("%d leases ended with DELETE while workers were killed: each instance is gone, its quota released", leased)
	e.report("Worker kills", l, fmt.Sprintf("%d × SIGKILL of one of 2 workers at a moment it held work (%d queue messages in all), restarted at once; %d leases ending meanwhile; %d creates sent again with their idempotency key",
		kills, held, leased, l.Retries()))
}

// leases creates n instances whose leases end with DELETE after d, a second apart, and
// records each lease's end in the ledger as the delete it is: the final check then wants them
// gone, with their quota released, however the workers carrying them out were killed.
func (e *env) leases(n int, d time.Duration) int {
	ctx, cancel := context.WithTimeout(context.Background(), stepLimit)
	defer cancel()
	for i := range n {
		ref := Ref{Org: "acme", Project: "web", Network: "net-acme-web-eu", Name: fmt.Sprintf("leased-%d", i)}
		spec := Spec{Description: ref.Name, FlavorID: flavors[0]}
		end := time.Now().Add(d + time.Duration(i)*time.Second)
		var data struct {
			CreateInstance payload `json:"createInstance"`
		}
		err := e.clients[0].Do(ctx, `mutation($in: CreateInstanceInput!) { createInstance(input: $in) { instance { id } userErrors { code } } }`,
			map[string]any{"in": map[string]any{"organizationId": ref.Org, "projectId": ref.Project, "networkId": ref.Network, "name": ref.Name,
				"description": spec.Description, "flavorId": spec.FlavorID, "imageId": "ubuntu-24.04",
				"expiresAt": end.UTC().Format(time.RFC3339Nano), "expiryAction": "DELETE"}}, &data)
		if out := outcome(err, data.CreateInstance); out != Acked {
			e.t.Fatalf("create %s with a lease: %v (%v)", ref.Name, out, err)
		}
		id := data.CreateInstance.Instance.ID
		e.ledger.Record(ref, id, Op{Kind: OpCreate, Outcome: Acked, At: time.Now(), Spec: spec})
		e.ledger.Record(ref, id, Op{Kind: OpDelete, Outcome: Acked, At: end})
	}
	return n
}

// awaitHolding waits until the worker holds work and returns how much, or 0 once the load is
// done.
func (e *env) awaitHolding(w *harness.Process, done <-chan struct{}) int64 {
	var held int64
	eventually.Holds(e.t, stepLimit, func() bool {
		select {
		case <-done:
			held = 0
			return true
		default:
		}
		var err error
		if held, err = w.Holding(context.Background()); err != nil {
			e.t.Fatal(err)
		}
		return held > 0
	}, "%s holds queue messages", w.Name)
	return held
}

// everysecLoss is what appendfsync everysec may lose when Redis dies: Redis writes its
// append-only file before it answers unless an fsync is still running, in which case it puts
// the write off for up to 2 s (and then blocks), so writes answered within the last 2 s may be
// only in its memory. A crash of the machine loses what the kernel had not flushed: up to the
// last second or two likewise.
const everysecLoss = 2 * time.Second

// redisDown is how long Redis stays down.
const redisDown = 2 * time.Second

// TestChaosRedisRestart kills Redis (SIGKILL) halfway through the load and starts it again on
// the same port and data directory after a pause. Every process must reconnect by itself.
// With appendfsync always, nothing acknowledged may be lost; with everysec, only writes
// acknowledged in the last everysecLoss before the kill may be missing, and what survived
// must satisfy every invariant as it is.
func TestChaosRedisRestart(t *testing.T) {
	t.Parallel()
	for _, fsync := range []string{"always", "everysec"} {
		t.Run("appendfsync "+fsync, func(t *testing.T) {
			t.Parallel()
			redisRestart(t, sizeOf(t), fsync)
		})
	}
}

func redisRestart(t *testing.T, sz size, fsync string) {
	srv := StartRedis(t, fsync)
	e := newEnv(t, srv.Harness(t), envOptions{apis: 1, workers: 2})
	l := &Load{Ops: sz.restartOps, Rate: sz.rate}
	done, at := e.load(l, 0.5)
	e.await("half the load answered", at[0])
	killing := time.Now()
	srv.Kill(t)
	killed := time.Now()
	atRisk := e.ledger.AckedBetween(killing.Add(-everysecLoss), killed)
	e.logf("redis-server killed (appendfsync %s); %d mutations acknowledged in the %s before", fsync, atRisk, everysecLoss)
	hold(redisDown)
	srv.Restart(t)
	e.logf("redis-server restarted")
	if fsync == "everysec" {
		e.checker.Lost = func(at time.Time) bool { return !at.Before(killing.Add(-everysecLoss)) && !at.After(killed) }
	}
	Ready(t, stepLimit, append(e.apis, e.workers...)...)
	e.logf("every process reconnected by itself")
	e.await("the load", done)
	final := e.finish(l)
	// The ledger checked without the loss window: what everysec actually lost.
	lost := len(e.ledger.Check(final.Stored, nil))
	e.logf("%d of the %d mutations acknowledged in the %s before the kill are missing from the store", lost, atRisk, everysecLoss)
	e.report(fmt.Sprintf("Redis restart, `appendfsync %s`", fsync), l,
		fmt.Sprintf("SIGKILL of redis-server at half the load, restarted on the same port and data after %s; %d mutations acknowledged in the %s before the kill, %d of them lost", redisDown, atRisk, everysecLoss, lost))
}

// TestChaosAPIRestart puts the many subscribers on one API and restarts it twice mid-load,
// once killed (SIGKILL) and once stopped (SIGTERM, which must exit cleanly). Every subscriber
// resumes with the cursor of the last event it received and must end with exactly its scope's
// log: nothing missed across the restarts, nothing twice, all in order. The load goes to both
// APIs, and the four subscribers every scenario has are spread over both.
func TestChaosAPIRestart(t *testing.T) {
	t.Parallel()
	sz := sizeOf(t)
	e := newEnv(t, harness.StartRedis(t), envOptions{apis: 2, workers: 2})
	scopes := []struct{ org, project string }{{"acme", ""}, {"globex", ""}, {"acme", "web"}, {"acme", "data"}, {"globex", "prod"}, {"globex", "staging"}}
	restarted := e.apis[0]
	var mine []*Watcher
	for i := range sz.subscribers {
		w := e.watch(restarted, scopes[i%len(scopes)].org, scopes[i%len(scopes)].project)
		mine = append(mine, w)
		e.watchers = append(e.watchers, w)
	}
	e.logf("%d subscribers on %s", len(mine), restarted.Name)
	l := &Load{Ops: sz.apiOps, Rate: sz.apiRate}
	done, at := e.load(l, 1.0/3, 2.0/3)
	var at2 []int // mutations answered when each restart began and ended
	restart := func(how string, stop func()) {
		at2 = append(at2, l.Answered())
		stop()
		ctx, cancel := context.WithTimeout(context.Background(), stepLimit)
		defer cancel()
		var on []*Watcher
		for _, w := range e.watchers {
			if w.API == restarted {
				on = append(on, w)
			}
		}
		for _, w := range on {
			if err := w.AwaitEnd(ctx); err != nil {
				t.Fatalf("%v did not end when its API stopped: %v", w, err)
			}
		}
		restarted.Restart(t)
		for _, w := range on {
			w.Resume(t)
		}
		at2 = append(at2, l.Answered())
		e.logf("%s %s; its %d subscribers resumed with their cursors (load: %d to %d of %d answered meanwhile)", how, restarted.Name, len(on), at2[len(at2)-2], at2[len(at2)-1], l.Ops)
	}
	e.await("a third of the load answered", at[0])
	restart("killed and restarted", func() { restarted.Kill(t) })
	e.await("two thirds of the load answered", at[1])
	restart("stopped with SIGTERM and restarted", func() {
		if err := restarted.Terminate(t); err != nil {
			t.Fatalf("%s did not stop cleanly on SIGTERM: %v", restarted.Name, err)
		}
	})
	e.await("the load", done)
	e.finish(l)
	for _, w := range mine {
		if w.Resumes < 2 {
			t.Fatalf("%v resumed %d times, want at least 2: the restarts did not reach it", w, w.Resumes)
		}
	}
	e.report("API restart with subscribers", l,
		fmt.Sprintf("the API serving %d subscribers killed (SIGKILL), later stopped (SIGTERM), restarted each time, while the load went from %d to %d and from %d to %d mutations answered; each subscriber resumed with its cursor after each",
			len(mine), at2[0], at2[1], at2[2], at2[3]))
}

// regionFaults are the simulated region's faults on the workers: a tenth of calls fail, every
// call is slow, every create makes a duplicate server, and servers of instances named fail-…
// end in ERROR instead of running.
const regionFaults = `{"errorRate": 0.1, "slowCalls": "20ms", "failBuildPrefix": "fail-", "duplicateCreates": true}`

// TestChaosRegionFaults runs the load against a misbehaving region, and meanwhile deletes
// running servers behind the workers' backs, through the simulator itself as the region's
// own operators would. Every instance must end with exactly one server: running, or for a
// failed build, in ERROR with the instance ERROR and saying why.
func TestChaosRegionFaults(t *testing.T) {
	t.Parallel()
	sz := sizeOf(t)
	e := newEnv(t, harness.StartRedis(t), envOptions{apis: 1, workers: 2, workerArgs: []string{"--region-faults", regionFaults}, failPrefix: "fail-"})
	cloud, err := sim.New(e.redis.Client, sim.Options{Catalog: region.Demo()})
	if err != nil {
		t.Fatal(err)
	}
	l := &Load{Ops: sz.faultOps, Rate: sz.rate, FailPrefix: "fail-"}
	done, _ := e.load(l)
	rng := rand.New(rand.NewPCG(4, 4))
	deleted := 0
	ticker := time.NewTicker(sz.deleteEvery)
	defer ticker.Stop()
deleting:
	for {
		select {
		case <-done:
			break deleting
		case <-ticker.C:
		}
		servers, err := cloud.Servers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var candidates []region.Server
		for _, s := range servers {
			if s.State == region.ServerRunning && !strings.HasPrefix(s.Name, "fail-") {
				candidates = append(candidates, s)
			}
		}
		if len(candidates) == 0 {
			continue
		}
		victim := candidates[rng.IntN(len(candidates))]
		if err := cloud.DeleteServer(context.Background(), victim.ID); err != nil {
			t.Fatal(err)
		}
		deleted++
	}
	e.logf("%d running servers deleted behind the workers' backs", deleted)
	final := e.finish(l)
	failed := 0
	for _, inst := range final.Instances {
		if strings.HasPrefix(inst.Name, "fail-") {
			failed++
		}
	}
	errs := e.metric("computeql_region_call_errors_total", e.workers...)
	dups := e.metric("computeql_reconcile_duplicate_servers_total", e.workers...)
	e.logf("%.0f region calls failed by injection, %.0f duplicate servers deleted, %d instances ERROR for a failed build", errs, dups, failed)
	if errs == 0 || dups == 0 || failed == 0 || deleted == 0 {
		t.Fatal("a fault was never injected: the scenario proved nothing about it")
	}
	e.report("Region faults", l, fmt.Sprintf("`--region-faults %s` on both workers: %.0f region calls failed, %.0f duplicate servers made and removed, %d instances (named `fail-…`) failed to build and show ERROR; %d running servers deleted behind the workers' backs and recreated",
		regionFaults, errs, dups, failed, deleted))
}

// blipFor is how long one network blip lasts: longer than the Redis client's 3 s read
// timeout, so that a stalled connection is given up on rather than waited out.
const blipFor = 4 * time.Second

// TestChaosNetworkBlips puts a TCP proxy between every process and Redis and cuts it a few
// times mid-load, alternately resetting every connection (and refusing new ones) and stalling
// them (silence both ways), for blipFor each. Every process must recover by itself.
func TestChaosNetworkBlips(t *testing.T) {
	t.Parallel()
	sz := sizeOf(t)
	r := harness.StartRedis(t)
	proxy := StartProxy(t, r.Addrs[0])
	e := newEnv(t, &harness.Redis{URL: "redis://" + proxy.Addr + "/0", Client: r.Client, Addrs: r.Addrs}, envOptions{apis: 1, workers: 2})
	marks := make([]float64, sz.blips)
	for i := range marks {
		marks[i] = float64(i+1) / float64(sz.blips+1)
	}
	l := &Load{Ops: sz.blipOps, Rate: sz.rate}
	done, at := e.load(l, marks...)
	resets, stalls, reset, stalled := 0, 0, 0, 0
	for i := range sz.blips {
		e.await(fmt.Sprintf("%.0f%% of the load answered", marks[i]*100), at[i])
		var n int
		if i%2 == 0 {
			n = proxy.Reset()
			resets, reset = resets+1, reset+n
			e.logf("blip %d: %d connections to Redis reset, new ones refused", i+1, n)
		} else {
			n = proxy.Stall()
			stalls, stalled = stalls+1, stalled+n
			e.logf("blip %d: %d connections to Redis stalled", i+1, n)
		}
		if n == 0 {
			t.Fatal("the blip cut no connection: the processes do not reach Redis through the proxy")
		}
		hold(blipFor)
		proxy.Restore()
		Ready(t, stepLimit, append(e.apis, e.workers...)...)
		e.logf("blip %d over; every process reaches Redis again", i+1)
	}
	e.await("the load", done)
	e.finish(l)
	e.report("Network blips", l, fmt.Sprintf("every process reaches Redis through a loopback TCP proxy, cut %d × by resetting every connection (%d in all) and refusing new ones, and %d × by stalling every connection (%d in all), %s each",
		resets, reset, stalls, stalled, blipFor))
}
