package worker_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/metrictest"
	"github.com/computeql/computeql/region"
)

// A lost enqueue (an API process that died between its store write and its enqueue) is healed
// by the periodic resync, whose passes also count the instances by provisioning status. The second instance is created after the first was found, so after
// the pass the worker makes as it starts; it has no server whose events could wake it, so only
// a later pass can.
func TestResyncHealsLostEnqueue(t *testing.T) {
	e := newEnv(t, func(s *setup) {
		s.serviceQueue = droppingQueue{}
		s.worker.ResyncInterval = 50 * time.Millisecond
	})
	first := e.create(t, "web-1")
	e.waitRunning(t, first.ID)
	second := e.create(t, "web-2")
	if waiting, err := e.q.Waiting(bg, second.Key()); err != nil || waiting {
		t.Fatalf("%s waits on the queue (%v): the enqueue was not lost", second.Key(), err)
	}
	e.waitRunning(t, second.ID)
	if n := metrictest.Value(t, e.reg, "computeql_resync_enqueued_total"); n < 2 {
		t.Errorf("the instances ran but the resync enqueued %v keys, want at least 2", n)
	}
	// The passes also count the instances: both provisioned in acme, none elsewhere.
	eventually.Holds(t, 5*time.Second, func() bool {
		return metrictest.Value(t, e.reg, "computeql_instances", "organization", "acme", "provisioning", "PROVISIONED") == 2 &&
			metrictest.Value(t, e.reg, "computeql_instances", "organization", "acme", "provisioning", "PENDING") == 0
	}, "acme's instances counted as %v provisioned, %v pending; want 2 and 0",
		metrictest.Value(t, e.reg, "computeql_instances", "organization", "acme", "provisioning", "PROVISIONED"),
		metrictest.Value(t, e.reg, "computeql_instances", "organization", "acme", "provisioning", "PENDING"))
}

// Server events whose owner cannot be found are counted by
// reason, not silently dropped.
func TestWatcherCountsOrphanEvents(t *testing.T) {
	e := newEnv(t)
	scope := region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: "eu-west", NetworkID: "net-acme-web-eu"}
	stray := func(tags map[string]string) func() {
		return func() {
			if _, err := e.probe.CreateServer(bg, region.ServerSpec{
				Scope: scope, Name: "stray", FlavorID: "g1.small", ImageID: "ubuntu-24.04", Tags: tags,
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The watcher reads events from the moment it starts; until then (a few milliseconds after
	// the worker starts) a server made is not seen, so make one until one is.
	counted(t, stray(nil), func() bool {
		return metrictest.Value(t, e.reg, "computeql_region_orphan_events_total", "reason", "untagged") > 0
	}, "an untagged server event counted")
	if n := metrictest.Value(t, e.reg, "computeql_region_orphan_events_total", "reason", "unknown_instance"); n != 0 {
		t.Errorf("%v events of an unknown instance before there was one", n)
	}
	unknown := uuid.NewString()
	counted(t, stray(map[string]string{region.InstanceTag: unknown}), func() bool {
		return metrictest.Value(t, e.reg, "computeql_region_orphan_events_total", "reason", "unknown_instance") > 0
	}, "an event of an unknown instance counted")
}

// counted makes something happen until cond holds, giving each attempt a moment.
func counted(t *testing.T, make func(), cond func() bool, what string) {
	t.Helper()
	for range 20 {
		make()
		deadline := time.Now().Add(250 * time.Millisecond)
		for time.Now().Before(deadline) {
			if cond() {
				return
			}
			time.Sleep(3 * time.Millisecond)
		}
	}
	t.Fatalf("never: %s", what)
}
