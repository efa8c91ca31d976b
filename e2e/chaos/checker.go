package chaos

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
	"github.com/computeql/computeql/store"
)

// Instance is an instance as the API shows it.
type Instance = harness.Instance

// State is everything the invariants judge, read at one moment: the instances and quota
// usage as the API shows them, and from Redis the stored instances, the region's servers, the
// work queue and every organization's event log.
type State struct {
	Instances   []Instance
	Used        map[string]map[string]int64 // organization → quota kind → used
	Stored      []*instance.Instance
	Servers     []region.Server
	Backlog     map[string]map[string]float64 // queue gauge → shard → value
	DeadLetters []queue.DeadLetter
	Log         map[string][]instance.Record // organization → its event log, oldest first
}

// Checker reads a deployment's State and checks the invariants on it:
//
//   - settled: every instance is PROVISIONED in the power state asked for with its newest
//     generation realised, or, if the region fails to build it, ERROR with a reason; none is
//     still being deleted. (Gone ones are simply not listed.)
//   - quota: each organization's usage, for every kind, is the sum of what its instances are
//     charged, computed here from the catalogue's flavors.
//   - servers: exactly one backing server per instance, in its scope and in the state that
//     matches it; no server of the organizations without an instance.
//   - queue: nothing waiting, pending or delayed in any shard (all 16 read); every dead letter
//     accounted for: its instance is gone, or its history shows it was marked ERROR.
//   - ledger: every mutation the API acknowledged is in the store (Ledger.Check).
type Checker struct {
	// API is a client whose token is an admin of every organization checked.
	API *harness.Client
	// Redis is read directly: the store, the region's servers, the queue, the event logs.
	Redis redis.UniversalClient
	// Organizations are the organizations checked.
	Organizations []string
	// Catalog is the region's catalogue. Defaults to region.Demo().
	Catalog *region.Catalog
	// Ledger holds the load's mutations. Required.
	Ledger *Ledger
	// FailsToBuild says whether the region fails to build the servers of instances with the
	// name (its failBuildPrefix). Defaults to none.
	FailsToBuild func(name string) bool
	// Lost says whether a write acknowledged at a time may have been lost with Redis. Defaults
	// to none.
	Lost func(time.Time) bool
}

func (c *Checker) catalog() *region.Catalog {
	if c.Catalog == nil {
		return region.Demo()
	}
	return c.Catalog
}

// Read reads the state once.
func (c *Checker) Read(ctx context.Context) (*State, error) {
	s := &State{Used: map[string]map[string]int64{}, Log: map[string][]instance.Record{}}
	st := store.New(c.Redis)
	for _, org := range c.Organizations {
		insts, err := c.API.Instances(ctx, org)
		if err != nil {
			return nil, err
		}
		s.Instances = append(s.Instances, insts...)
		q, err := c.API.Quota(ctx, org)
		if err != nil {
			return nil, err
		}
		s.Used[org] = q.Used
		for after := ""; ; {
			// Whole: the ledger compares descriptions.
			batch, err := st.ListWhole(ctx, org, "", after, 500)
			if err != nil {
				return nil, fmt.Errorf("stored instances of %s: %w", org, err)
			}
			s.Stored = append(s.Stored, batch...)
			if len(batch) < 500 {
				break
			}
			after = batch[len(batch)-1].ID
		}
		if s.Log[org], err = ReadLog(ctx, c.Redis, org); err != nil {
			return nil, err
		}
	}
	cloud, err := sim.New(c.Redis, sim.Options{Catalog: c.catalog()})
	if err != nil {
		return nil, err
	}
	if s.Servers, err = cloud.Servers(ctx); err != nil {
		return nil, err
	}
	if s.Backlog, err = backlog(c.Redis); err != nil {
		return nil, err
	}
	q, err := queue.New(c.Redis, queue.Options{})
	if err != nil {
		return nil, err
	}
	if s.DeadLetters, err = q.DeadLetters(ctx, 10_000); err != nil {
		return nil, err
	}
	return s, nil
}

// ReadLog reads an organization's whole event log from Redis, oldest first.
func ReadLog(ctx context.Context, rdb redis.UniversalClient, org string) ([]instance.Record, error) {
	st := store.New(rdb)
	var out []instance.Record
	for after := "0-0"; ; {
		batch, err := st.ReadEvents(ctx, org, after, -1) // a negative block: never wait
		if err != nil {
			return nil, fmt.Errorf("event log of %s: %w", org, err)
		}
		if len(batch) == 0 {
			return out, nil
		}
		out = append(out, batch...)
		after = batch[len(batch)-1].Cursor
	}
}

// backlogGauges are the queue's figures that must all be 0 once everything settled.
var backlogGauges = []string{"computeql_queue_depth", "computeql_queue_pending", "computeql_queue_delayed"}

// backlog reads the queue's backlog by shard, as the gauges of /metrics name its figures.
func backlog(rdb redis.UniversalClient) (map[string]map[string]float64, error) {
	q, err := queue.New(rdb, queue.Options{})
	if err != nil {
		return nil, err
	}
	shards, err := q.Backlog(context.Background())
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]float64{}
	for _, g := range backlogGauges {
		out[g] = map[string]float64{}
	}
	for shard, bl := range shards {
		label := strconv.Itoa(shard)
		out["computeql_queue_depth"][label] = float64(bl.Depth)
		out["computeql_queue_pending"][label] = float64(bl.Pending)
		out["computeql_queue_delayed"][label] = float64(bl.Delayed)
	}
	return out, nil
}

// queueShards is the binary's number of queue shards (queue.Options' default).
const queueShards = 16

// Check returns every violation of the invariants in the state.
func (c *Checker) Check(s *State) []error {
	var v []error
	v = append(v, c.checkSettled(s)...)
	v = append(v, c.checkQuota(s)...)
	v = append(v, c.checkServers(s)...)
	v = append(v, checkQueue(s)...)
	v = append(v, c.Ledger.Check(s.Stored, c.Lost)...)
	return v
}

func (c *Checker) failsToBuild(name string) bool {
	return c.FailsToBuild != nil && c.FailsToBuild(name)
}

func (c *Checker) checkSettled(s *State) []error {
	var v []error
	for _, inst := range s.Instances {
		st := inst.Status
		reason := ""
		for _, cond := range st.Conditions {
			if cond.Reason == string(instance.ReasonErrored) && cond.Message != "" {
				reason = cond.Message
			}
		}
		switch {
		case inst.DeletedAt != nil:
			v = append(v, fmt.Errorf("instance %s (%s) is still being deleted: %s/%s", inst.ID, inst.Name, st.ProvisioningStatus, st.PowerState))
		case c.failsToBuild(inst.Name):
			if st.ProvisioningStatus != string(instance.ProvisioningError) || reason == "" {
				v = append(v, fmt.Errorf("instance %s (%s), whose builds fail, is %s with no Errored reason (%q), want ERROR with one",
					inst.ID, inst.Name, st.ProvisioningStatus, reason))
			}
		case st.ProvisioningStatus == string(instance.ProvisioningError):
			v = append(v, fmt.Errorf("instance %s (%s) is ERROR (%q), though the region builds it", inst.ID, inst.Name, reason))
		case st.ProvisioningStatus != string(instance.ProvisioningProvisioned) || st.PowerState != inst.DesiredPowerState || inst.ObservedGeneration != inst.Generation:
			v = append(v, fmt.Errorf("instance %s (%s) is not settled: %s/%s (wants %s), generation %d observed %d",
				inst.ID, inst.Name, st.ProvisioningStatus, st.PowerState, inst.DesiredPowerState, inst.Generation, inst.ObservedGeneration))
		}
	}
	return v
}

// quotaKinds are the kinds of quota an instance is charged.
var quotaKinds = []string{"servers", "gpus", "publicIPs", "cpus", "memoryGiB"}

func (c *Checker) checkQuota(s *State) []error {
	var v []error
	cat := c.catalog()
	sums := map[string]map[string]int64{}
	for _, org := range c.Organizations {
		sums[org] = map[string]int64{}
	}
	for _, inst := range s.Instances {
		f, ok := cat.Flavor(inst.FlavorID)
		if !ok {
			v = append(v, fmt.Errorf("instance %s has flavor %q, which the catalogue lacks: its charge is unknown", inst.ID, inst.FlavorID))
			continue
		}
		sum := sums[inst.OrganizationID]
		if sum == nil {
			v = append(v, fmt.Errorf("instance %s is in organization %q, which is not checked", inst.ID, inst.OrganizationID))
			continue
		}
		sum["servers"]++
		sum["cpus"] += f.CPUs
		sum["memoryGiB"] += f.MemoryGiB
		if f.GPU != nil {
			sum["gpus"] += f.GPU.PhysicalCount
		}
		if inst.Networking.PublicIP {
			sum["publicIPs"]++
		}
	}
	for _, org := range c.Organizations {
		for _, kind := range quotaKinds {
			if got, want := s.Used[org][kind], sums[org][kind]; got != want {
				v = append(v, fmt.Errorf("organization %s uses %d %s by its quota, its instances are charged %d", org, got, kind, want))
			}
		}
	}
	return v
}

func (c *Checker) checkServers(s *State) []error {
	var v []error
	live := map[string]*Instance{}
	for i := range s.Instances {
		live[s.Instances[i].ID] = &s.Instances[i]
	}
	backing := map[string][]region.Server{}
	for _, srv := range s.Servers {
		if !slices.Contains(c.Organizations, srv.OrganizationID) {
			continue
		}
		id := srv.Tags[region.InstanceTag]
		if live[id] == nil {
			v = append(v, fmt.Errorf("server %s (%s, instance tag %q) belongs to no instance", srv.ID, srv.State, id))
			continue
		}
		backing[id] = append(backing[id], srv)
	}
	ids := make([]string, 0, len(live))
	for id := range live {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		inst := live[id]
		srvs := backing[id]
		if len(srvs) != 1 {
			states := make([]string, len(srvs))
			for i, srv := range srvs {
				states[i] = string(srv.State)
			}
			v = append(v, fmt.Errorf("instance %s (%s) has %d backing servers %v, want 1", id, inst.Name, len(srvs), states))
			continue
		}
		srv := srvs[0]
		regionID := ""
		if inst.Region != nil {
			regionID = inst.Region.ID
		}
		if want := (region.Scope{OrganizationID: inst.OrganizationID, ProjectID: inst.ProjectID, RegionID: regionID, NetworkID: inst.NetworkID}); srv.Scope != want {
			v = append(v, fmt.Errorf("instance %s: its server %s is in %+v, want %+v", id, srv.ID, srv.Scope, want))
		}
		want := region.ServerRunning
		if c.failsToBuild(inst.Name) {
			want = region.ServerError
		}
		if srv.State != want {
			v = append(v, fmt.Errorf("instance %s (%s): its server %s is %s, want %s", id, inst.Name, srv.ID, srv.State, want))
		}
		if srv.FlavorID != inst.FlavorID {
			v = append(v, fmt.Errorf("instance %s (%s) has flavor %s, its server %s %s", id, inst.Name, inst.FlavorID, srv.ID, srv.FlavorID))
		}
	}
	return v
}

func checkQueue(s *State) []error {
	var v []error
	for _, gauge := range backlogGauges {
		shards := s.Backlog[gauge]
		if len(shards) != queueShards {
			v = append(v, fmt.Errorf("queue: %s read for %d of %d shards", gauge, len(shards), queueShards))
		}
		for shard, n := range shards {
			if n != 0 {
				v = append(v, fmt.Errorf("queue shard %s: %s is %v, want 0", shard, gauge, n))
			}
		}
	}
	live := map[string]bool{}
	for _, inst := range s.Instances {
		live[instance.Key(inst.OrganizationID, inst.ID)] = true
	}
	for _, d := range s.DeadLetters {
		org, id, _ := strings.Cut(d.Key, "/")
		if !live[d.Key] {
			continue // gone: nothing was left undone
		}
		shownError := false
		for _, rec := range s.Log[org] {
			if rec.Instance.ID == id && rec.Instance.Status.ProvisioningStatus == instance.ProvisioningError && !rec.At.Before(d.At) {
				shownError = true
			}
		}
		if !shownError {
			v = append(v, fmt.Errorf("dead letter %s of %s (%q, after %d attempts) is not accounted for: its instance lives and its history never shows it ERROR since",
				d.ID, d.Key, d.Reason, d.Attempts))
		}
	}
	return v
}

// settlePoll is the least time between two reads of Settle.
const settlePoll = 250 * time.Millisecond

// Settle waits until the state has no violation and returns it; after limit the test fails
// with the violations of the last check.
func (c *Checker) Settle(tb testing.TB, limit time.Duration) *State {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var state *State
	var last []error
	var readErr error
	var lastRead time.Time
	eventually.Holds(tb, limit, func() bool {
		// A read lists everything; back to back they would take the machine from the very
		// processes being waited for.
		if time.Since(lastRead) < settlePoll {
			return false
		}
		lastRead = time.Now()
		state, readErr = c.Read(ctx)
		if readErr != nil {
			return false
		}
		last = c.Check(state)
		return len(last) == 0
	}, "the deployment settles with every invariant holding; last read error %v, last violations (%v):\n%v",
		eventually.Lazy(func() string { return fmt.Sprint(readErr) }), eventually.Lazy(func() string { return fmt.Sprint(len(last)) }), eventually.Lazy(func() string { return summarize(last) }))
	return state
}

// summarize joins the first violations, and counts the rest.
func summarize(violations []error) string {
	const shown = 20
	var b strings.Builder
	for i, err := range violations {
		if i == shown {
			fmt.Fprintf(&b, "… and %d more\n", len(violations)-shown)
			break
		}
		b.WriteString(err.Error() + "\n")
	}
	return b.String()
}
