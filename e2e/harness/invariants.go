package harness

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
)

// Instance is an instance as the API shows it, with what the invariants need.
type Instance struct {
	ID             string  `json:"id"`
	Name           string  `json:"name"`
	OrganizationID string  `json:"organizationId"`
	ProjectID      string  `json:"projectId"`
	NetworkID      string  `json:"networkId"`
	FlavorID       string  `json:"flavorId"`
	Region         *IDOnly `json:"region"`
	Networking     struct {
		PublicIP bool `json:"publicIP"`
	} `json:"networking"`
	Generation         int64   `json:"generation"`
	ObservedGeneration int64   `json:"observedGeneration"`
	DesiredPowerState  string  `json:"desiredPowerState"`
	DeletedAt          *string `json:"deletedAt"`
	Status             struct {
		ProvisioningStatus string `json:"provisioningStatus"`
		PowerState         string `json:"powerState"`
		HealthStatus       string `json:"healthStatus"`
		Conditions         []struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"conditions"`
	} `json:"status"`
}

// IDOnly is an object of which only the id is selected.
type IDOnly struct {
	ID string `json:"id"`
}

// InstanceFields selects every field of Instance.
const InstanceFields = `id name organizationId projectId networkId flavorId region { id } networking { publicIP }
	generation observedGeneration desiredPowerState deletedAt
	status { provisioningStatus powerState healthStatus conditions { reason message } }`

// Settled reports whether nothing is left to do for the instance: not being deleted, and
// either given up on (ERROR, whose generation is never realised) or provisioned in the power
// state asked for with its newest spec realised.
func (i *Instance) Settled() bool {
	if i.DeletedAt != nil {
		return false
	}
	return i.Status.ProvisioningStatus == "ERROR" ||
		i.ObservedGeneration == i.Generation && i.Status.ProvisioningStatus == "PROVISIONED" && i.Status.PowerState == i.DesiredPowerState
}

// Running reports whether the instance is provisioned and running.
func (i *Instance) Running() bool {
	return i.Status.ProvisioningStatus == "PROVISIONED" && i.Status.PowerState == "RUNNING"
}

// Instances lists every instance of the organization through the API, oldest first.
func (c *Client) Instances(ctx context.Context, org string) ([]Instance, error) {
	var out []Instance
	var after *string
	for {
		var data struct {
			Instances struct {
				Edges []struct {
					Node Instance `json:"node"`
				} `json:"edges"`
				PageInfo struct {
					HasNextPage bool    `json:"hasNextPage"`
					EndCursor   *string `json:"endCursor"`
				} `json:"pageInfo"`
			} `json:"instances"`
		}
		err := c.Do(ctx, `query($org: ID!, $after: String) { instances(organizationId: $org, first: 100, after: $after) {
			edges { node { `+InstanceFields+` } } pageInfo { hasNextPage endCursor } } }`,
			map[string]any{"org": org, "after": after}, &data)
		if err != nil {
			return nil, fmt.Errorf("list instances of %s: %w", org, err)
		}
		for _, e := range data.Instances.Edges {
			out = append(out, e.Node)
		}
		if !data.Instances.PageInfo.HasNextPage {
			return out, nil
		}
		after = data.Instances.PageInfo.EndCursor
	}
}

// SetQuota sets the organization's limits (kind → limit) through the API.
func (c *Client) SetQuota(ctx context.Context, org string, limits map[string]int) error {
	var data struct {
		SetQuota struct {
			UserErrors Errors `json:"userErrors"`
		} `json:"setQuota"`
	}
	var in []map[string]any
	for kind, limit := range limits {
		in = append(in, map[string]any{"kind": kind, "limit": limit})
	}
	err := c.Do(ctx, `mutation($in: SetQuotaInput!) { setQuota(input: $in) { userErrors { message } } }`,
		map[string]any{"in": map[string]any{"organizationId": org, "limits": in}}, &data)
	if err == nil && len(data.SetQuota.UserErrors) > 0 {
		err = data.SetQuota.UserErrors
	}
	if err != nil {
		return fmt.Errorf("set the quota of %s: %w", org, err)
	}
	return nil
}

// Quota is an organization's limits and usage by kind, through the API.
type Quota struct{ Limit, Used map[string]int64 }

// Quota reads the organization's quota through the API.
func (c *Client) Quota(ctx context.Context, org string) (Quota, error) {
	var data struct {
		Quota struct {
			Limits []struct {
				Kind  string `json:"kind"`
				Limit int64  `json:"limit"`
				Used  int64  `json:"used"`
			} `json:"limits"`
		} `json:"quota"`
	}
	if err := c.Do(ctx, `query($org: ID!) { quota(organizationId: $org) { limits { kind limit used } } }`, map[string]any{"org": org}, &data); err != nil {
		return Quota{}, fmt.Errorf("quota of %s: %w", org, err)
	}
	q := Quota{Limit: map[string]int64{}, Used: map[string]int64{}}
	for _, l := range data.Quota.Limits {
		q.Limit[l.Kind], q.Used[l.Kind] = l.Limit, l.Used
	}
	return q, nil
}

// Checker asserts the invariants of a deployment that has settled, whatever it went through:
//
//   - every instance is settled (see Instance.Settled), and with AllRunning, running;
//   - each organization's quota usage, as the API reports it, is the sum of its instances'
//     charges (servers 1, gpus the flavor's GPUs, publicIPs 1 with a public IP,
//     the flavor's cpus and memoryGiB), computed here from what the API shows;
//   - every instance has exactly one backing server in the simulated region, in its scope,
//     and no server of the organizations is without an instance;
//   - the work queue is empty: nothing waiting, delivered and unfinished, delayed or
//     dead-lettered in any shard.
type Checker struct {
	// API is a client whose token is an admin of every organization checked.
	API *Client
	// Redis is read for what the API does not show: the region's servers and the queue.
	Redis redis.UniversalClient
	// Organizations are the organizations checked.
	Organizations []string
	// Catalog is the region's catalogue. Defaults to region.Demo().
	Catalog *region.Catalog
	// Queue are the deployment's queue options. Defaults to the binary's (queue.Options{}).
	Queue queue.Options
	// AllRunning requires every instance to be provisioned and running.
	AllRunning bool
}

// Check checks the invariants once. It returns the instances it saw, by organization, and
// every violation joined in one error.
func (c *Checker) Check(ctx context.Context) (map[string][]Instance, error) {
	flavors, err := c.flavors(ctx)
	if err != nil {
		return nil, err
	}
	var violations []error
	bad := func(format string, args ...any) { violations = append(violations, fmt.Errorf(format, args...)) }
	byOrg := map[string][]Instance{}
	live := map[string]*Instance{}
	for _, org := range c.Organizations {
		insts, err := c.API.Instances(ctx, org)
		if err != nil {
			return nil, err
		}
		q, err := c.API.Quota(ctx, org)
		if err != nil {
			return nil, err
		}
		byOrg[org] = insts
		sum := map[string]int64{}
		for i := range insts {
			inst := &insts[i]
			live[inst.ID] = inst
			switch {
			case !inst.Settled():
				bad("instance %s (%s) is not settled: %s/%s, generation %d observed %d, deleting %v",
					inst.ID, inst.Name, inst.Status.ProvisioningStatus, inst.Status.PowerState, inst.Generation, inst.ObservedGeneration, inst.DeletedAt != nil)
			case c.AllRunning && !inst.Running():
				bad("instance %s (%s) is %s/%s, not PROVISIONED/RUNNING", inst.ID, inst.Name, inst.Status.ProvisioningStatus, inst.Status.PowerState)
			}
			f, ok := flavors[inst.FlavorID]
			if !ok {
				bad("instance %s: flavor %s unknown: its charge cannot be checked", inst.ID, inst.FlavorID)
				continue
			}
			sum["servers"]++
			sum["gpus"] += f.GPUs
			sum["cpus"] += f.CPUs
			sum["memoryGiB"] += f.MemoryGiB
			if inst.Networking.PublicIP {
				sum["publicIPs"]++
			}
		}
		for _, kind := range []string{"servers", "gpus", "publicIPs", "cpus", "memoryGiB"} {
			if q.Used[kind] != sum[kind] {
				bad("organization %s: quota says %d %s used, its %d instances are charged %d", org, q.Used[kind], kind, len(insts), sum[kind])
			}
		}
	}
	if err := c.checkServers(ctx, live, &violations); err != nil {
		return nil, err
	}
	if err := c.checkQueue(&violations); err != nil {
		return nil, err
	}
	return byOrg, errors.Join(violations...)
}

type flavor struct{ CPUs, MemoryGiB, GPUs int64 }

func (c *Checker) flavors(ctx context.Context) (map[string]flavor, error) {
	var data struct {
		Flavors []struct {
			ID        string `json:"id"`
			CPUs      int64  `json:"cpus"`
			MemoryGiB int64  `json:"memoryGiB"`
			GPU       *struct {
				PhysicalCount int64 `json:"physicalCount"`
			} `json:"gpu"`
		} `json:"flavors"`
	}
	if err := c.API.Do(ctx, `{ flavors { id cpus memoryGiB gpu { physicalCount } } }`, nil, &data); err != nil {
		return nil, fmt.Errorf("flavors: %w", err)
	}
	out := map[string]flavor{}
	for _, f := range data.Flavors {
		fl := flavor{CPUs: f.CPUs, MemoryGiB: f.MemoryGiB}
		if f.GPU != nil {
			fl.GPUs = f.GPU.PhysicalCount
		}
		out[f.ID] = fl
	}
	return out, nil
}

// checkServers compares the region's servers with the live instances.
func (c *Checker) checkServers(ctx context.Context, live map[string]*Instance, violations *[]error) error {
	cat := c.Catalog
	if cat == nil {
		cat = region.Demo()
	}
	cloud, err := sim.New(c.Redis, sim.Options{Catalog: cat})
	if err != nil {
		return err
	}
	servers, err := cloud.Servers(ctx)
	if err != nil {
		return err
	}
	bad := func(format string, args ...any) { *violations = append(*violations, fmt.Errorf(format, args...)) }
	backing := map[string][]region.Server{}
	for _, srv := range servers {
		if !slices.Contains(c.Organizations, srv.OrganizationID) {
			continue
		}
		id := srv.Tags[region.InstanceTag]
		if live[id] == nil {
			bad("server %s (%s, instance tag %q) belongs to no instance", srv.ID, srv.State, id)
			continue
		}
		backing[id] = append(backing[id], srv)
	}
	for id, inst := range live {
		srvs := backing[id]
		if len(srvs) != 1 {
			bad("instance %s (%s) has %d backing servers, want 1", id, inst.Name, len(srvs))
			continue
		}
		srv := srvs[0]
		regionID := ""
		if inst.Region != nil {
			regionID = inst.Region.ID
		}
		want := region.Scope{OrganizationID: inst.OrganizationID, ProjectID: inst.ProjectID, RegionID: regionID, NetworkID: inst.NetworkID}
		if srv.Scope != want {
			bad("instance %s: its server %s is in %+v, want %+v", id, srv.ID, srv.Scope, want)
		}
		if c.AllRunning && srv.State != region.ServerRunning {
			bad("instance %s: its server %s is %s, not RUNNING", id, srv.ID, srv.State)
		}
	}
	return nil
}

// checkQueue reads every shard's backlog; each figure must be 0. Violations name the gauge
// that shows the figure on /metrics.
func (c *Checker) checkQueue(violations *[]error) error {
	q, err := queue.New(c.Redis, c.Queue)
	if err != nil {
		return err
	}
	backlog, err := q.Backlog(context.Background())
	if err != nil {
		return err
	}
	for shard, bl := range backlog {
		for _, f := range []struct {
			gauge string
			n     int64
		}{{"computeql_queue_depth", bl.Depth}, {"computeql_queue_pending", bl.Pending}, {"computeql_queue_delayed", bl.Delayed}, {"computeql_queue_dead_letters", bl.Dead}} {
			if f.n != 0 {
				*violations = append(*violations, fmt.Errorf("queue shard %d: %s is %d, want 0", shard, f.gauge, f.n))
			}
		}
	}
	return nil
}

// Settled waits until every invariant holds at once and returns the instances of that check;
// the test fails after limit with the violations of the last check.
func (c *Checker) Settled(tb testing.TB, limit time.Duration) map[string][]Instance {
	tb.Helper()
	var last error
	var insts map[string][]Instance
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	eventually.Holds(tb, limit, func() bool {
		insts, last = c.Check(ctx)
		return last == nil
	}, "the deployment settles with its invariants; last check:\n%v", eventually.Lazy(func() string { return fmt.Sprint(last) }))
	return insts
}
