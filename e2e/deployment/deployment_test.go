// Package deployment tests computeql as it runs in production: separate api and worker
// processes of the built binary sharing one real Redis — a redis-server, or a local 3-master
// Redis Cluster — creating hundreds of instances over both APIs while subscribers on both
// watch, once undisturbed and once with a worker stopped mid-run.
//
// What "each subscriber saw every event of its scope" is checked against: every instance's
// history, read back afterwards with the instanceEvents query. The history comes from the
// organization's event log by range reads, the subscriptions from each API's live reader: two
// paths over the same log, so a lost, duplicated or reordered delivery shows as a difference.
// (A second subscription with `after` would go through the same feed as the first and could
// share its bugs.) Subscribers start after a few seed instances exist, so each one's SNAPSHOT
// proves it is live before the instances under test are created.
//
// COMPUTEQL_E2E_INSTANCES sets how many instances a run creates (default 500; at most about
// 1,900, what the demo catalogue's eight /24 networks have addresses for). See package harness
// for the other variables (a prebuilt binary, a race-built one, keeping the processes' logs).
package deployment

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/eventually"
)

func TestMain(m *testing.M) { harness.Main(m) }

// The tests of this package run in parallel: each owns its Redis and its processes, and much
// of a run is spent waiting (for the queue's lease, above all), which the others can use.

// TestDeploymentOnStandalone runs the suite on one redis-server.
func TestDeploymentOnStandalone(t *testing.T) {
	t.Parallel()
	suite(t, harness.StartRedis(t))
}

// TestDeploymentOnCluster runs the suite on a 3-master Redis Cluster: the processes reach it
// through a redis+cluster:// URL, and every key, script and blocking read must find its node.
func TestDeploymentOnCluster(t *testing.T) {
	t.Parallel()
	suite(t, harness.StartCluster(t, 3))
}

func suite(t *testing.T, r *harness.Redis) {
	t.Run("all reach RUNNING", func(t *testing.T) { scenario(t, r, false) })
	t.Run("a worker stopped mid-run", func(t *testing.T) { scenario(t, r, true) })
}

// Waits are bounded far above what a step needs on a loaded two-core machine, so a failure
// means a step did not happen, not that it was slow. settleLimit also covers the queue's lease
// (30s): messages a stopped worker had read but not begun are reclaimed only after it.
const (
	stepLimit   = 60 * time.Second
	settleLimit = 120 * time.Second
	creators    = 8 // concurrent createInstance calls
)

// project is where instances go: its networks take turns.
type project struct {
	org, id  string
	networks []string
}

var projects = []project{
	{"acme", "web", []string{"net-acme-web-eu", "net-acme-web-us"}},
	{"acme", "data", []string{"net-acme-data-eu", "net-acme-data-us"}},
	{"globex", "prod", []string{"net-globex-prod-eu", "net-globex-prod-us"}},
	{"globex", "staging", []string{"net-globex-staging-eu", "net-globex-staging-us"}},
}

var orgs = []string{"acme", "globex"}

// watcher is a subscriber on one API to one scope (a whole organization when project is ""),
// with a viewer token of exactly that scope.
type watcher struct {
	api          int
	org, project string
	sub          *harness.Subscription
}

func (w *watcher) String() string {
	return fmt.Sprintf("subscriber %s/%s on api-%d", w.org, w.project, w.api+1)
}

func (w *watcher) covers(org, project string) bool {
	return org == w.org && (w.project == "" || project == w.project)
}

// seedsCovered returns the seeds in the watcher's scope.
func (w *watcher) seedsCovered(seeds map[string]created) []string {
	var ids []string
	for id, s := range seeds {
		if w.covers(s.project.org, s.project.id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// event is what a subscription and a history show of one event.
type event struct {
	Cursor   string `json:"cursor"`
	Kind     string `json:"kind"`
	Instance struct {
		ID             string `json:"id"`
		OrganizationID string `json:"organizationId"`
		ProjectID      string `json:"projectId"`
		Status         struct {
			ProvisioningStatus string `json:"provisioningStatus"`
			PowerState         string `json:"powerState"`
		} `json:"status"`
	} `json:"instance"`
}

const subscription = `subscription($org: ID!, $project: ID) { instanceEvents(organizationId: $org, projectId: $project) {
	cursor kind instance { id organizationId projectId status { provisioningStatus powerState } } } }`

func decode(t *testing.T, raw json.RawMessage) event {
	t.Helper()
	var data struct {
		InstanceEvents event `json:"instanceEvents"`
	}
	if err := json.Unmarshal(raw, &data); err != nil {
		t.Fatalf("decode event %s: %v", raw, err)
	}
	return data.InstanceEvents
}

// created is an instance the run created, and where.
type created struct {
	id, name string
	project  project
}

func instances() int {
	if s := os.Getenv("COMPUTEQL_E2E_INSTANCES"); s != "" {
		n, err := strconv.Atoi(s)
		if err == nil && n > 0 {
			return n
		}
	}
	return 500
}

// scenario starts 2 APIs and 2 workers on a flushed Redis, creates the instances over both
// APIs while four subscribers watch, optionally stops a worker with SIGTERM while it holds
// work, and checks the outcome.
func scenario(t *testing.T, r *harness.Redis, stopWorker bool) {
	start := time.Now()
	elapsed := func() time.Duration { return time.Since(start).Round(time.Millisecond) }
	r.Flush(t)
	d := harness.NewDeployment(t, r, harness.Options{
		// Servers build quickly so the run is about throughput and delivery, not waiting; the
		// rate limit would only measure itself.
		Args: []string{"--build-delay", "100ms", "--rate-limit", "-1"},
	})
	apis := []*harness.Process{d.API(t), d.API(t)}
	workers := []*harness.Process{d.Worker(t), d.Worker(t)}
	adminToken := d.Token(t, "--subject", "e2e-admin", "--grant", "acme=admin", "--grant", "globex=admin")
	admins := []*harness.Client{apis[0].Client(t, adminToken), apis[1].Client(t, adminToken)}
	ctx, cancel := context.WithTimeout(context.Background(), settleLimit+3*stepLimit)
	defer cancel()
	n := instances()
	for _, org := range orgs {
		setQuota(ctx, t, admins[0], org, n)
	}
	checker := &harness.Checker{API: admins[1], Redis: r.Client, Organizations: orgs, AllRunning: true}

	// Seeds, settled before anyone subscribes: each subscription's SNAPSHOT of them proves
	// it is live, so that every event of the instances created afterwards is owed to it.
	seeds := map[string]created{}
	for i, p := range projects {
		c := create(ctx, admins[i%2], p, "seed", 0)
		if c.err != nil {
			t.Fatal(c.err)
		}
		seeds[c.id] = c.created
	}
	checker.Settled(t, stepLimit)
	t.Logf("%s: %d seeds settled", elapsed(), len(seeds))
	watchers := []*watcher{{api: 0, org: "acme"}, {api: 0, org: "globex", project: "prod"}, {api: 1, org: "acme", project: "web"}, {api: 1, org: "globex"}}
	for _, w := range watchers {
		grant := w.org
		if w.project != "" {
			grant += "/" + w.project
		}
		token := d.Token(t, "--subject", "e2e-viewer", "--grant", grant+"=viewer")
		vars := map[string]any{"org": w.org}
		if w.project != "" {
			vars["project"] = w.project
		}
		w.sub = apis[w.api].Subscribe(t, token, subscription, vars)
		want := 0
		for _, s := range seeds {
			if w.covers(s.project.org, s.project.id) {
				want++
			}
		}
		snapshots := 0
		err := w.sub.Wait(ctx, func(batch []json.RawMessage) bool {
			for _, raw := range batch {
				if ev := decode(t, raw); ev.Kind == "SNAPSHOT" {
					snapshots++
				}
			}
			return snapshots == want
		})
		if err != nil {
			t.Fatalf("%v: waiting for the snapshot of %d seeds: %v", w, want, err)
		}
	}

	// The instances under test, spread over both APIs, the four projects and their networks;
	// the test's goroutine meanwhile stops a worker once half of them exist.
	half := make(chan struct{})
	creating, stopCreating := context.WithCancel(ctx)
	var made []created
	var createErr error
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		made, createErr = createAll(creating, admins, n, func(done int) {
			if done == n/2 {
				close(half)
			}
		})
	}()
	t.Cleanup(func() { stopCreating(); <-finished })
	if stopWorker {
		select {
		case <-half:
			stopHolding(t, workers[1])
		case <-finished: // failed early: reported below
		}
	}
	<-finished
	if createErr != nil {
		t.Fatal(createErr)
	}
	t.Logf("%s: %d instances created", elapsed(), len(made))
	d.Alive(t)

	// All RUNNING, as the organization-wide subscribers see it (they watch every instance);
	// then, independently, the invariants through the API and Redis.
	for _, w := range watchers {
		if w.project == "" {
			waitRunning(ctx, t, w, made)
		}
	}
	t.Logf("%s: all seen RUNNING by the organization-wide subscribers", elapsed())
	settled := checker.Settled(t, settleLimit)
	t.Logf("%s: invariants hold", elapsed())
	for _, org := range orgs {
		want := 0
		for _, c := range made {
			if c.project.org == org {
				want++
			}
		}
		if got := len(settled[org]) - 2; got != want { // two seeds per organization
			t.Errorf("organization %s has %d instances besides its seeds, want %d", org, got, want)
		}
	}
	d.Alive(t)
	compareWithHistory(ctx, t, admins, watchers, made, seeds)
}

func setQuota(ctx context.Context, t *testing.T, c *harness.Client, org string, n int) {
	t.Helper()
	if err := c.SetQuota(ctx, org, map[string]int{"servers": n + 10, "publicIPs": n, "cpus": 2 * (n + 10), "memoryGiB": 4 * (n + 10)}); err != nil {
		t.Fatal(err)
	}
}

type result struct {
	created
	err error
}

// create creates the i-th instance of a kind in the project: g1.small (2 cpus, 4 GiB), every
// tenth with a public IP so that quota has more than one kind to count.
func create(ctx context.Context, c *harness.Client, p project, kind string, i int) result {
	name := fmt.Sprintf("%s-%d", kind, i)
	in := map[string]any{
		"organizationId": p.org, "projectId": p.id, "networkId": p.networks[i%len(p.networks)], "name": name,
		"flavorId": "g1.small", "imageId": "ubuntu-24.04", "networking": map[string]any{"publicIP": i%10 == 0},
	}
	var data struct {
		CreateInstance struct {
			Instance *struct {
				ID string `json:"id"`
			} `json:"instance"`
			UserErrors []harness.Error `json:"userErrors"`
		} `json:"createInstance"`
	}
	err := c.Do(ctx, `mutation($in: CreateInstanceInput!) { createInstance(input: $in) { instance { id } userErrors { message } } }`,
		map[string]any{"in": in}, &data)
	switch {
	case err != nil:
		return result{err: fmt.Errorf("create %s/%s %s: %w", p.org, p.id, name, err)}
	case len(data.CreateInstance.UserErrors) > 0 || data.CreateInstance.Instance == nil:
		return result{err: fmt.Errorf("create %s/%s %s: %v", p.org, p.id, name, data.CreateInstance.UserErrors)}
	}
	return result{created: created{id: data.CreateInstance.Instance.ID, name: name, project: p}}
}

// createAll creates n instances with a few concurrent callers, the i-th over API i%2 in
// project i%4. progress is called after each creation with the count so far, in order.
func createAll(ctx context.Context, admins []*harness.Client, n int, progress func(done int)) ([]created, error) {
	results := make(chan result)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range creators {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				results <- create(ctx, admins[i%2], projects[i%len(projects)], "vm", i)
			}
		})
	}
	go func() { wg.Wait(); close(results) }()
	var out []created
	var errs []error
	for r := range results {
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		out = append(out, r.created)
		progress(len(out))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%d of %d creates failed; first: %w", len(errs), n, errs[0])
	}
	return out, nil
}

// stopHolding sends SIGTERM to the worker at a moment it holds work (messages delivered to it
// and not finished), so that the stop is mid-run by evidence, not by timing, and requires a
// clean exit: in-flight reconciles finish, the rest is left for the other worker.
func stopHolding(t *testing.T, w *harness.Process) {
	t.Helper()
	var held int64
	eventually.Holds(t, stepLimit, func() bool {
		var err error
		held, err = w.Holding(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return held > 0
	}, "%s holds queue messages", w.Name)
	if err := w.Terminate(t); err != nil {
		t.Fatalf("%s, stopped with SIGTERM while holding %d messages, did not exit cleanly: %v\n%s", w.Name, held, err, w.Tail(30))
	}
	t.Logf("%s stopped with SIGTERM while holding %d messages", w.Name, held)
}

// waitRunning waits until the organization-wide subscriber's latest event of each instance of
// its organization says PROVISIONED and RUNNING.
func waitRunning(ctx context.Context, t *testing.T, w *watcher, made []created) {
	t.Helper()
	pending := map[string]bool{}
	for _, c := range made {
		if w.covers(c.project.org, c.project.id) {
			pending[c.id] = true
		}
	}
	err := w.sub.Wait(ctx, func(batch []json.RawMessage) bool {
		for _, raw := range batch {
			ev := decode(t, raw)
			if _, ours := pending[ev.Instance.ID]; ours {
				pending[ev.Instance.ID] = ev.Instance.Status.ProvisioningStatus != "PROVISIONED" || ev.Instance.Status.PowerState != "RUNNING"
			}
		}
		for _, waiting := range pending {
			if waiting {
				return false
			}
		}
		return true
	})
	if err != nil {
		left := 0
		for _, waiting := range pending {
			if waiting {
				left++
			}
		}
		t.Fatalf("%v: %d instances not seen RUNNING: %v", w, left, err)
	}
}

// step is one event of an instance: what a subscriber and the history must agree on.
type step struct{ cursor, kind string }

// compareWithHistory checks each subscriber against the instances' histories: for every
// created instance in its scope, exactly the history's events in the history's order; for each
// seed, one SNAPSHOT and then only events the history has after it; nothing out of scope; and
// the subscription still open.
func compareWithHistory(ctx context.Context, t *testing.T, admins []*harness.Client, watchers []*watcher, made []created, seeds map[string]created) {
	t.Helper()
	ids := make([]string, 0, len(made)+len(seeds))
	for _, c := range made {
		ids = append(ids, c.id)
	}
	for id := range seeds {
		ids = append(ids, id)
	}
	history := histories(ctx, t, admins, ids)
	for _, w := range watchers {
		if ended, err := w.sub.Ended(); ended {
			t.Errorf("%v ended: %v", w, err)
		}
		seen := map[string][]step{}
		snapshots := map[string]int{}
		synced := 0
		for _, raw := range w.sub.Events() {
			ev := decode(t, raw)
			if ev.Kind == "SYNCED" {
				if synced++; synced > 1 || len(snapshots) != len(w.seedsCovered(seeds)) {
					t.Errorf("%v: SYNCED after %d snapshots (SYNCED number %d), want one, after every seed's", w, len(snapshots), synced)
				}
				continue
			}
			if !w.covers(ev.Instance.OrganizationID, ev.Instance.ProjectID) {
				t.Errorf("%v got an event of %s in %s/%s", w, ev.Instance.ID, ev.Instance.OrganizationID, ev.Instance.ProjectID)
			}
			if ev.Kind == "SNAPSHOT" {
				snapshots[ev.Instance.ID]++
				continue
			}
			seen[ev.Instance.ID] = append(seen[ev.Instance.ID], step{ev.Cursor, ev.Kind})
		}
		missing, wrong := 0, 0
		for _, c := range made {
			want := history[c.id]
			if !w.covers(c.project.org, c.project.id) {
				want = nil
			}
			got := seen[c.id]
			if slices.Equal(got, want) {
				continue
			}
			if wrong++; wrong <= 3 {
				t.Errorf("%v, instance %s (%s/%s): saw %v, history %v", w, c.id, c.project.org, c.project.id, got, want)
			}
			if len(got) < len(want) {
				missing += len(want) - len(got)
			}
		}
		if wrong > 0 {
			t.Errorf("%v: %d instances' events differ from their history (%d events short)", w, wrong, missing)
		}
		for id, s := range seeds {
			if !w.covers(s.project.org, s.project.id) {
				continue
			}
			h := history[id]
			if got := seen[id]; snapshots[id] != 1 || len(got) > len(h) || !slices.Equal(got, h[len(h)-len(got):]) {
				t.Errorf("%v, seed %s: %d snapshots, then %v; history %v", w, id, snapshots[id], got, h)
			}
		}
	}
}

// histories reads every instance's full history with the instanceEvents query, over both APIs.
func histories(ctx context.Context, t *testing.T, admins []*harness.Client, ids []string) map[string][]step {
	t.Helper()
	var mu sync.Mutex
	out := map[string][]step{}
	var errs []error
	var next atomic.Int64
	var wg sync.WaitGroup
	for range creators {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(ids); i = int(next.Add(1)) - 1 {
				steps, err := historyOf(ctx, admins[i%2], ids[i])
				mu.Lock()
				out[ids[i]] = steps
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d histories unreadable; first: %v", len(errs), errs[0])
	}
	return out
}

func historyOf(ctx context.Context, c *harness.Client, id string) ([]step, error) {
	var out []step
	var after *string
	for {
		var data struct {
			InstanceEvents struct {
				Edges []struct {
					Node event `json:"node"`
				} `json:"edges"`
				PageInfo struct {
					HasNextPage bool    `json:"hasNextPage"`
					EndCursor   *string `json:"endCursor"`
				} `json:"pageInfo"`
			} `json:"instanceEvents"`
		}
		err := c.Do(ctx, `query($id: ID!, $after: String) { instanceEvents(id: $id, first: 100, after: $after) {
			edges { node { cursor kind } } pageInfo { hasNextPage endCursor } } }`, map[string]any{"id": id, "after": after}, &data)
		if err != nil {
			return nil, fmt.Errorf("history of %s: %w", id, err)
		}
		for _, e := range data.InstanceEvents.Edges {
			out = append(out, step{e.Node.Cursor, e.Node.Kind})
		}
		if !data.InstanceEvents.PageInfo.HasNextPage {
			return out, nil
		}
		after = data.InstanceEvents.PageInfo.EndCursor
	}
}
