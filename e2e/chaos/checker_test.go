package chaos

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/region"
)

// The checker's every invariant must be able to fail: each case below starts from a state
// that satisfies them all, breaks one thing, and wants the violation that says so.

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// cleanState has two instances of acme/web: web-1 running on g1.small with a public IP, and
// fail-1 on g1.medium, whose build failed; their servers, quota usage, an empty queue, the
// store's copies matching the ledger, and a log with their events.
func cleanState() (*Checker, *State) {
	ledger := NewLedger()
	s := &State{
		Used: map[string]map[string]int64{
			"acme":   {"servers": 2, "gpus": 0, "publicIPs": 1, "cpus": 2 + 4, "memoryGiB": 4 + 16},
			"globex": {},
		},
		Backlog: map[string]map[string]float64{},
		Log:     map[string][]instance.Record{},
	}
	for _, g := range backlogGauges {
		s.Backlog[g] = map[string]float64{}
		for shard := range queueShards {
			s.Backlog[g][strconv.Itoa(shard)] = 0
		}
	}
	add := func(id, name, flavor string, publicIP bool, status string, state region.ServerState) {
		inst := Instance{ID: id, Name: name, OrganizationID: "acme", ProjectID: "web", NetworkID: "net-acme-web-eu", FlavorID: flavor,
			Region: &harness.IDOnly{ID: "eu-west"}, Generation: 1, ObservedGeneration: 1, DesiredPowerState: "RUNNING"}
		inst.Networking.PublicIP = publicIP
		inst.Status.ProvisioningStatus, inst.Status.PowerState = status, string(state)
		if state == region.ServerError {
			inst.ObservedGeneration = 0 // a failed build never realises its generation
			inst.Status.Conditions = append(inst.Status.Conditions, struct {
				Reason  string `json:"reason"`
				Message string `json:"message"`
			}{"Errored", "the server failed to build"})
		}
		s.Instances = append(s.Instances, inst)
		scope := region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: "eu-west", NetworkID: "net-acme-web-eu"}
		s.Servers = append(s.Servers, region.Server{ID: "srv-" + id, State: state,
			ServerSpec: region.ServerSpec{Scope: scope, Name: name, FlavorID: flavor, Tags: map[string]string{region.InstanceTag: id}}})
		spec := Spec{Description: name + " op 1", FlavorID: flavor, PublicIP: publicIP}
		stored := &instance.Instance{ID: id, OrganizationID: "acme", ProjectID: "web", Generation: 1, Spec: instance.Spec{
			Name: name, Description: spec.Description, NetworkID: "net-acme-web-eu", FlavorID: flavor, Networking: instance.Networking{PublicIP: publicIP}}}
		stored.Status.ProvisioningStatus = instance.ProvisioningStatus(status)
		s.Stored = append(s.Stored, stored)
		ledger.Record(Ref{"acme", "web", "net-acme-web-eu", name}, id, Op{Kind: OpCreate, Outcome: Acked, At: t0, Spec: spec})
		s.Log["acme"] = append(s.Log["acme"], instance.Record{Cursor: strconv.Itoa(len(s.Log["acme"])+1) + "-0", Kind: instance.EventCreated, Instance: stored, At: t0})
	}
	add("i1", "web-1", "g1.small", true, "PROVISIONED", region.ServerRunning)
	add("i2", "fail-1", "g1.medium", false, "ERROR", region.ServerError)
	c := &Checker{Organizations: []string{"acme", "globex"}, Ledger: ledger, FailsToBuild: func(name string) bool { return strings.HasPrefix(name, "fail-") }}
	return c, s
}

func TestCheckCleanState(t *testing.T) {
	c, s := cleanState()
	if v := c.Check(s); len(v) > 0 {
		t.Fatalf("a clean state has violations:\n%s", summarize(v))
	}
}

func TestCheckFindsEachViolation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(s *State)
		want  string
	}{
		{"instance still provisioning", func(s *State) { s.Instances[0].Status.ProvisioningStatus = "PROVISIONING" }, "i1 (web-1) is not settled"},
		{"generation not realised", func(s *State) { s.Instances[0].Generation = 2 }, "generation 2 observed 1"},
		{"stopped though it should run", func(s *State) { s.Instances[0].Status.PowerState = "STOPPED" }, "is not settled: PROVISIONED/STOPPED (wants RUNNING)"},
		{"instance still being deleted", func(s *State) { at := "now"; s.Instances[0].DeletedAt = &at }, "i1 (web-1) is still being deleted"},
		{"ERROR though the region builds it", func(s *State) { s.Instances[0].Status.ProvisioningStatus = "ERROR" }, "i1 (web-1) is ERROR"},
		{"failed build not ERROR", func(s *State) { s.Instances[1].Status.ProvisioningStatus = "PROVISIONING" }, "fail-1), whose builds fail, is PROVISIONING"},
		{"ERROR without a reason", func(s *State) { s.Instances[1].Status.Conditions = nil }, "fail-1), whose builds fail, is ERROR with no Errored reason"},
		{"quota cpus off", func(s *State) { s.Used["acme"]["cpus"]++ }, "acme uses 7 cpus by its quota, its instances are charged 6"},
		{"quota public IP not released", func(s *State) { s.Instances[0].Networking.PublicIP = false }, "acme uses 1 publicIPs by its quota, its instances are charged 0"},
		{"quota servers of another organization", func(s *State) { s.Used["globex"]["servers"] = 1 }, "globex uses 1 servers by its quota, its instances are charged 0"},
		{"server missing", func(s *State) { s.Servers = s.Servers[1:] }, "i1 (web-1) has 0 backing servers"},
		{"duplicate server", func(s *State) {
			dup := s.Servers[0]
			dup.ID = "srv-dup"
			s.Servers = append(s.Servers, dup)
		}, "i1 (web-1) has 2 backing servers [RUNNING RUNNING]"},
		{"orphan server", func(s *State) {
			orphan := s.Servers[0]
			orphan.ID, orphan.Tags = "srv-orphan", map[string]string{region.InstanceTag: "gone"}
			s.Servers = append(s.Servers, orphan)
		}, `server srv-orphan (RUNNING, instance tag "gone") belongs to no instance`},
		{"server in another scope", func(s *State) { s.Servers[0].NetworkID = "net-acme-web-us" }, "its server srv-i1 is in"},
		{"server not running", func(s *State) { s.Servers[0].State = region.ServerStopped }, "its server srv-i1 is STOPPED, want RUNNING"},
		{"server not resized", func(s *State) { s.Servers[0].FlavorID = "g1.medium" }, "i1 (web-1) has flavor g1.small, its server srv-i1 g1.medium"},
		{"failed build's server running", func(s *State) { s.Servers[1].State = region.ServerRunning }, "its server srv-i2 is RUNNING, want ERROR"},
		{"work waiting", func(s *State) { s.Backlog["computeql_queue_depth"]["3"] = 1 }, "queue shard 3: computeql_queue_depth is 1, want 0"},
		{"work pending", func(s *State) { s.Backlog["computeql_queue_pending"]["0"] = 2 }, "computeql_queue_pending is 2"},
		{"work delayed", func(s *State) { s.Backlog["computeql_queue_delayed"]["15"] = 1 }, "computeql_queue_delayed is 1"},
		{"a shard unread", func(s *State) { delete(s.Backlog["computeql_queue_pending"], "7") }, "computeql_queue_pending read for 15 of 16 shards"},
		{"dead letter unaccounted", func(s *State) {
			s.DeadLetters = append(s.DeadLetters, queue.DeadLetter{ID: "1/1-0", Key: "acme/i1", Reason: "boom", Attempts: 10, At: t0})
		}, "dead letter 1/1-0 of acme/i1"},
		{"dead letter shown ERROR only before it", func(s *State) {
			s.DeadLetters = append(s.DeadLetters, queue.DeadLetter{ID: "1/1-0", Key: "acme/i2", Reason: "boom", Attempts: 10, At: t0.Add(time.Second)})
		}, "dead letter 1/1-0 of acme/i2"},
		{"acknowledged create lost", func(s *State) { s.Stored = s.Stored[1:] }, "acme/web/net-acme-web-eu/web-1 (i1): the store holds absent"},
		{"stored instance nobody created", func(s *State) {
			s.Stored = append(s.Stored, &instance.Instance{ID: "i9", OrganizationID: "acme", ProjectID: "web", Spec: instance.Spec{Name: "ghost", NetworkID: "net-acme-web-eu"}})
		}, "ghost (i9) is in the store, but no recorded mutation created it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := cleanState()
			tc.spoil(s)
			v := c.Check(s)
			if len(v) == 0 {
				t.Fatalf("no violation; want one saying %q", tc.want)
			}
			if got := summarize(v); !strings.Contains(got, tc.want) {
				t.Fatalf("violations:\n%s\nwant one saying %q", got, tc.want)
			}
		})
	}
}

func TestCheckAccountsForDeadLetters(t *testing.T) {
	c, s := cleanState()
	// fail-1's ERROR event is at t0, after its dead letter; a dead letter of an instance
	// that is gone left nothing undone.
	s.DeadLetters = []queue.DeadLetter{
		{ID: "1/1-0", Key: "acme/i2", Reason: "boom", Attempts: 10, At: t0},
		{ID: "2/1-0", Key: "acme/gone", Reason: "boom", Attempts: 10, At: t0},
	}
	if v := c.Check(s); len(v) > 0 {
		t.Fatalf("accounted dead letters reported:\n%s", summarize(v))
	}
}
