package server

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/worker"
)

const resizeDoc = `mutation($in: ResizeInstanceInput!) { resizeInstance(input: $in) {
  instance { id flavorId generation status { powerState } }
  userErrors { field code message }
  plan { rebuild restart changedFields quotaChanges { kind delta } } } }`

// resizePayload is a ResizeInstancePayload as resizeDoc selects it.
type resizePayload struct {
	Instance *struct {
		ID         string `json:"id"`
		FlavorID   string `json:"flavorId"`
		Generation int    `json:"generation"`
	} `json:"instance"`
	UserErrors []userError `json:"userErrors"`
	Plan       *gqlPlan    `json:"plan"`
}

func (a *api) resize(tb testing.TB, token string, in map[string]any) (*gqlResponse, resizePayload) {
	tb.Helper()
	res := a.post(tb, token, resizeDoc, map[string]any{"in": in})
	var p resizePayload
	if res.Data != nil && res.Data["resizeInstance"] != nil {
		decode(tb, res.Data["resizeInstance"], &p)
	}
	return res, p
}

// resizeSubQuery is the organization's subscription with what a resize changes.
const resizeSubQuery = `subscription { instanceEvents(organizationId: "acme") {
  kind changedFields actor action outcome
  instance { id flavorId desiredPowerState generation observedGeneration
    status { provisioningStatus powerState privateIP macAddress conditions { type status reason message } } } } }`

// resizeEvent is one event of resizeSubQuery.
type resizeEvent struct {
	Kind          string   `json:"kind"`
	ChangedFields []string `json:"changedFields"`
	Actor         *string  `json:"actor"`
	Action        *string  `json:"action"`
	Outcome       *string  `json:"outcome"`
	Instance      struct {
		ID                 string `json:"id"`
		FlavorID           string `json:"flavorId"`
		DesiredPowerState  string `json:"desiredPowerState"`
		Generation         int    `json:"generation"`
		ObservedGeneration int    `json:"observedGeneration"`
		Status             struct {
			ProvisioningStatus string  `json:"provisioningStatus"`
			PowerState         string  `json:"powerState"`
			PrivateIP          *string `json:"privateIP"`
			MACAddress         *string `json:"macAddress"`
			Conditions         []struct {
				Type    string `json:"type"`
				Status  string `json:"status"`
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"conditions"`
		} `json:"status"`
	} `json:"instance"`
}

// reason is the reason of the instance's Available condition.
func (ev resizeEvent) reason() string {
	for _, c := range ev.Instance.Status.Conditions {
		if c.Type == "Available" {
			return c.Reason
		}
	}
	return ""
}

// awaitResize reads the subscription until an event matches, and returns it; it fails the
// test after verbLimit, listing what it saw.
func awaitResize(c *wsClient, what string, match func(resizeEvent) bool) resizeEvent {
	c.tb.Helper()
	deadline := time.Now().Add(verbLimit)
	var seen []string
	for time.Now().Before(deadline) {
		ev := nextEvent[resizeEvent](c)
		if match(ev) {
			return ev
		}
		seen = append(seen, ev.Kind+" "+ev.Instance.Status.PowerState+" "+ev.reason())
	}
	c.tb.Fatalf("no %s within %s; seen %v", what, verbLimit, seen)
	return resizeEvent{}
}

// settled matches the instance realised at its generation, powered as state, with the flavor.
func settled(id, flavor, state string) func(resizeEvent) bool {
	return func(ev resizeEvent) bool {
		i := ev.Instance
		return ev.Kind == "STATUS_CHANGED" && i.ID == id && i.FlavorID == flavor && i.Status.PowerState == state &&
			i.ObservedGeneration == i.Generation && ev.reason() == "Provisioned"
	}
}

// quotaUsed returns the organization's quota usage per kind.
func (a *api) quotaUsed(tb testing.TB, token, org string) map[string]int {
	tb.Helper()
	var q struct {
		Limits []struct {
			Kind string `json:"kind"`
			Used int    `json:"used"`
		} `json:"limits"`
	}
	decode(tb, a.mustPost(tb, token, `query($o: ID!) { quota(organizationId: $o) { limits { kind used } } }`, map[string]any{"o": org}).Data["quota"], &q)
	out := map[string]int{}
	for _, l := range q.Limits {
		out[l.Kind] = l.Used
	}
	return out
}

// serverOf returns the one server the region has for the instance.
func (a *api) serverOf(tb testing.TB, id string) region.Server {
	tb.Helper()
	scope := region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: "eu-west", NetworkID: "net-acme-web-eu"}
	servers, err := a.region.FindServers(context.Background(), scope, region.InstanceTag, id)
	if err != nil || len(servers) != 1 {
		tb.Fatalf("servers of %s: %v, %v", id, servers, err)
	}
	return servers[0]
}

// TestResizeKeepsTheServer: resizing a running instance with allowRestart stops its server,
// gives it the new flavor and starts it again: the same server, with its address and MAC;
// the quota is charged by the difference at once; the history shows ACTION RESIZE with its
// caller, and the instance the Resizing condition until it is done. A stopped instance is
// resized without a restart and stays stopped.
func TestResizeKeepsTheServer(t *testing.T) {
	a, s := wsServer(t)
	a.realise(t)
	admin := a.admin(t)
	member := a.member(t)
	c := subscribeWS(t, s, protoTransportWS, admin, resizeSubQuery)
	id := a.mustCreate(t, admin, createInput("resized")).ID
	running := awaitResize(c, "the instance running", settled(id, "g1.small", "RUNNING"))
	before := a.serverOf(t, id)
	used := a.quotaUsed(t, admin, "acme")

	// Sent twice with its idempotency key: one resize, one charge, one ACTION.
	in := map[string]any{"id": id, "flavorId": "g1.medium", "allowRestart": true, "idempotencyKey": "grow-1"}
	for range 2 {
		res, p := a.resize(t, member, in)
		if p.Instance == nil || len(p.UserErrors) > 0 || p.Instance.FlavorID != "g1.medium" {
			t.Fatalf("resizeInstance or its retry: %s", res.Raw)
		}
	}
	// g1.small is 2 CPUs and 4 GiB, g1.medium 4 and 16: charged at once, before the server
	// changed.
	want := maps.Clone(used)
	want["cpus"] += 2
	want["memoryGiB"] += 12
	if got := a.quotaUsed(t, admin, "acme"); !maps.Equal(got, want) {
		t.Errorf("quota used after the resize %v, want %v", got, want)
	}
	act := awaitResize(c, "ACTION RESIZE", func(ev resizeEvent) bool {
		return ev.Kind == "ACTION" && ev.Instance.ID == id && ev.Action != nil && *ev.Action == "RESIZE"
	})
	if act.Actor == nil || *act.Actor != "mia" || act.Outcome != nil || !slices.Equal(act.ChangedFields, []string{"flavorId"}) {
		t.Errorf("resize event: actor %v outcome %v changed %v, want mia, none, [flavorId]", act.Actor, act.Outcome, act.ChangedFields)
	}
	if got := a.actionsOf(t, member, id); got["RESIZE"] != 1 {
		t.Errorf("actions after a resize and its retry: %v, want one RESIZE", got)
	}
	res, p := a.resize(t, member, with2(in, "flavorId", "g1.large"))
	wantUserErrors(t, res, payload{UserErrors: p.UserErrors}, fc("CONFLICT", "input", "idempotencyKey"))
	awaitResize(c, "the Resizing condition while the server stops", func(ev resizeEvent) bool {
		return ev.Instance.ID == id && ev.reason() == "Resizing" && ev.Instance.Status.PowerState == "STOPPING"
	})
	done := awaitResize(c, "the instance running with g1.medium", settled(id, "g1.medium", "RUNNING"))
	after := a.serverOf(t, id)
	if after.ID != before.ID || after.FlavorID != "g1.medium" {
		t.Errorf("server after the resize %s with %s, want %s with g1.medium", after.ID, after.FlavorID, before.ID)
	}
	if *done.Instance.Status.PrivateIP != *running.Instance.Status.PrivateIP || *done.Instance.Status.MACAddress != *running.Instance.Status.MACAddress {
		t.Errorf("address and MAC after the resize %s %s, want %s %s", *done.Instance.Status.PrivateIP, *done.Instance.Status.MACAddress,
			*running.Instance.Status.PrivateIP, *running.Instance.Status.MACAddress)
	}
	if done.Instance.DesiredPowerState != "RUNNING" {
		t.Errorf("desired power %s after a resize, want RUNNING", done.Instance.DesiredPowerState)
	}

	t.Run("stopped", func(t *testing.T) {
		a.mustPower(t, member, stopDoc, "stopInstance", map[string]any{"id": id})
		awaitResize(c, "the instance stopped", settled(id, "g1.medium", "STOPPED"))
		res, p := a.resize(t, member, map[string]any{"id": id, "flavorId": "g1.large"})
		if p.Instance == nil || len(p.UserErrors) > 0 {
			t.Fatalf("resizing a stopped instance without allowRestart: %s", res.Raw)
		}
		awaitResize(c, "the instance stopped with g1.large", settled(id, "g1.large", "STOPPED"))
		if srv := a.serverOf(t, id); srv.ID != before.ID || srv.FlavorID != "g1.large" || srv.State != region.ServerStopped {
			t.Errorf("server %s with %s, %s; want %s with g1.large, STOPPED", srv.ID, srv.FlavorID, srv.State, before.ID)
		}
	})
}

// TestResizeRules: every refusal is on its field with its code and leaves Redis as it was;
// a dry run says what the resize would do and writes nothing; a second resize or a start
// while one is under way is refused.
func TestResizeRules(t *testing.T) {
	a, s := wsServer(t)
	admin := a.admin(t)
	member := a.member(t)
	refused := func(t *testing.T, in map[string]any, want ...fieldCode) {
		t.Helper()
		before := redistest.State(t, a.rdb)
		res, p := a.resize(t, member, in)
		wantUserErrors(t, res, payload{UserErrors: p.UserErrors}, want...)
		if p.Plan != nil {
			t.Errorf("a refused resize has a plan: %s", res.Raw)
		}
		if !maps.Equal(before, redistest.State(t, a.rdb)) {
			t.Error("a refused resize changed Redis")
		}
	}
	pending := a.mustCreate(t, admin, createInput("pending")).ID
	refused(t, map[string]any{"id": pending, "flavorId": "g1.medium", "allowRestart": true}, fc("UNPROCESSABLE", "input", "id"))

	// The refusals below compare all of Redis before and after: no worker or region clock
	// may write meanwhile, so each runs only while the test waits for the region. The
	// subscription comes first: one opened after the workers could begin after the instance
	// ran, and would wait for a change already made (a CI run on a loaded machine did).
	c := subscribeWS(t, s, protoTransportWS, admin, resizeSubQuery)
	clock := a.realise(t)
	awaitResize(c, "the pending instance running", settled(pending, "g1.small", "RUNNING"))
	clock.stopWorkers()
	id := pending
	small := map[string]any{"id": id, "allowRestart": true}
	refused(t, with2(small, "flavorId", "nope"), fc("NOT_FOUND", "input", "flavorId"))
	refused(t, with2(small, "flavorId", "g1.small"), fc("UNPROCESSABLE", "input", "flavorId"))
	refused(t, with2(small, "flavorId", "a1.medium"), fc("UNPROCESSABLE", "input", "flavorId"))
	refused(t, map[string]any{"id": id, "flavorId": "g1.medium"}, fc("UNPROCESSABLE", "input", "allowRestart"))
	refused(t, map[string]any{"id": id, "flavorId": "g1.medium", "allowRestart": true, "idempotencyKey": "has space"}, fc("BAD_USER_INPUT", "input", "idempotencyKey"))

	// acme may use 4 more CPUs than it does: a g1.large (6 more than g1.small's 2) is over.
	used := a.quotaUsed(t, admin, "acme")
	a.mustPost(t, admin, `mutation($l: Int!) { setQuota(input: {organizationId: "acme", limits: [{kind: "cpus", limit: $l}]}) { userErrors { code } } }`,
		map[string]any{"l": used["cpus"] + 4})
	refused(t, with2(small, "flavorId", "g1.large"), fc("QUOTA_EXCEEDED", "input", "flavorId"))

	t.Run("dry run", func(t *testing.T) {
		before := redistest.State(t, a.rdb)
		res, p := a.resize(t, member, with2(small, "flavorId", "g1.medium", "dryRun", true))
		if p.Plan == nil || p.Instance != nil || len(p.UserErrors) > 0 {
			t.Fatalf("dry run: %s", res.Raw)
		}
		if !p.Plan.Restart || p.Plan.Rebuild || !slices.Equal(p.Plan.ChangedFields, []string{"flavorId"}) {
			t.Errorf("plan %+v, want a restart, no rebuild, flavorId changed", *p.Plan)
		}
		got := map[string]int{}
		for _, q := range p.Plan.QuotaChanges {
			got[q.Kind] = q.Delta
		}
		if !maps.Equal(got, map[string]int{"cpus": 2, "memoryGiB": 12}) {
			t.Errorf("quota changes %v, want cpus +2 and memoryGiB +12", got)
		}
		if !maps.Equal(before, redistest.State(t, a.rdb)) {
			t.Error("a dry run changed Redis")
		}
		// A dry run reports the same refusals as the resize.
		res, p = a.resize(t, member, map[string]any{"id": id, "flavorId": "g1.medium", "dryRun": true})
		wantUserErrors(t, res, payload{UserErrors: p.UserErrors}, fc("UNPROCESSABLE", "input", "allowRestart"))
	})

	t.Run("under way", func(t *testing.T) {
		// The region has no room for the new flavor: the server stopped for the resize stays
		// stopped, the resize under way, until the workers stop.
		gate := &resizeGate{Client: a.region, sentinel: region.ErrNoCapacity}
		stop := a.runWorkers(t, func(o *worker.Options) {
			o.Region, o.Yield, o.CapacityRetry = gate, 20*time.Millisecond, 20*time.Millisecond
		})
		res, p := a.resize(t, member, with2(small, "flavorId", "g1.medium"))
		if p.Instance == nil {
			t.Fatalf("resize: %s", res.Raw)
		}
		awaitResize(c, "the stopped server waiting for room", func(ev resizeEvent) bool {
			return ev.Instance.ID == id && ev.Instance.Status.PowerState == "STOPPED" && ev.reason() == "NoCapacity"
		})
		stop()
		refused(t, with2(small, "flavorId", "g1.large"), fc("UNPROCESSABLE", "input", "id"))
		before := redistest.State(t, a.rdb)
		res, pp := a.powerVerb(t, member, startDoc, "startInstance", map[string]any{"id": id})
		if len(pp.UserErrors) != 1 || pp.UserErrors[0].Code != "UNPROCESSABLE" || !strings.Contains(pp.UserErrors[0].Message, "resized") {
			t.Errorf("startInstance during a resize: %s, want UNPROCESSABLE saying it is being resized", res.Raw)
		}
		// The refusal is recorded as an ACTION; nothing else changes.
		for k, v := range redistest.State(t, a.rdb) {
			if before[k] != v && !strings.Contains(k, ":events") && !strings.HasSuffix(k, ":hi") {
				t.Errorf("a refused start changed %s beyond the ACTION it records", k)
			}
		}
	})
	clock = a.realise(t)
	awaitResize(c, "the instance running with g1.medium", settled(id, "g1.medium", "RUNNING"))
	clock.stopWorkers()
	refused(t, with2(small, "flavorId", "g1.small"), fc("UNPROCESSABLE", "input", "flavorId")) // a disk never shrinks
}

// with2 returns a copy of m with the key-value pairs set.
func with2(m map[string]any, kv ...any) map[string]any {
	out := maps.Clone(m)
	for i := 0; i < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// resizeGate is the simulated region, except that ResizeServer fails with an error wrapping
// sentinel until the test opens it.
type resizeGate struct {
	region.Client
	sentinel error
	open     atomic.Bool
}

func (g *resizeGate) ResizeServer(ctx context.Context, id, flavorID string) (region.Server, error) {
	if !g.open.Load() {
		return region.Server{}, fmt.Errorf("the host is out of %s: %w", "memory", g.sentinel)
	}
	return g.Client.ResizeServer(ctx, id, flavorID)
}

// TestResizeRegionSaysNo: a region without room for the new flavor leaves the instance
// stopped with the NoCapacity condition, tried again until there is room, then resized and
// started; a region that refuses the resize puts the instance in ERROR with its reason.
func TestResizeRegionSaysNo(t *testing.T) {
	for _, tc := range []struct {
		sentinel error
		reason   string
	}{
		{region.ErrNoCapacity, "NoCapacity"},
		{region.ErrRefused, "Errored"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			a, s := wsServer(t)
			admin := a.admin(t)
			gate := &resizeGate{Client: a.region, sentinel: tc.sentinel}
			a.runWorkers(t, func(o *worker.Options) {
				o.Region, o.Yield, o.CapacityRetry = gate, 20*time.Millisecond, 20*time.Millisecond
			})
			c := subscribeWS(t, s, protoTransportWS, admin, resizeSubQuery)
			id := a.mustCreate(t, admin, createInput("no-room")).ID
			awaitResize(c, "the instance running", settled(id, "g1.small", "RUNNING"))
			if res, p := a.resize(t, admin, map[string]any{"id": id, "flavorId": "g1.medium", "allowRestart": true}); p.Instance == nil {
				t.Fatalf("resize: %s", res.Raw)
			}
			held := awaitResize(c, "the "+tc.reason+" condition", func(ev resizeEvent) bool {
				return ev.Instance.ID == id && ev.reason() == tc.reason
			})
			msg := held.Instance.Status.Conditions[0].Message
			if !strings.Contains(msg, "out of memory") || !strings.Contains(msg, "g1.medium") {
				t.Errorf("condition message %q, want the region's reason and the flavor", msg)
			}
			if tc.sentinel == region.ErrRefused {
				if held.Instance.Status.ProvisioningStatus != "ERROR" {
					t.Errorf("a refused resize left the instance %s, want ERROR", held.Instance.Status.ProvisioningStatus)
				}
				return
			}
			if held.Instance.Status.PowerState != "STOPPED" || held.Instance.Status.ProvisioningStatus != "PROVISIONED" {
				t.Errorf("waiting for room: %s/%s, want PROVISIONED/STOPPED", held.Instance.Status.ProvisioningStatus, held.Instance.Status.PowerState)
			}
			gate.open.Store(true)
			awaitResize(c, "the instance running with g1.medium", settled(id, "g1.medium", "RUNNING"))
		})
	}
}
