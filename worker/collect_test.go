package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/metrictest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
)

// A server whose instance does not exist (its worker died between making it and recording
// it) is deleted by the resync's collection; the servers of live instances and servers
// without the instance tag are left alone.
func TestCollectDeletesOrphanedServers(t *testing.T) {
	var cloud *sim.Sim
	e := newEnv(t, func(s *setup) {
		s.manual = true
		s.worker.ResyncInterval = 20 * time.Millisecond
		s.worker.Servers = func(ctx context.Context) ([]region.Server, error) { return cloud.Servers(ctx) }
	})
	cloud = e.probe
	e.start(t)
	live := e.create(t, "web-1")
	e.waitRunning(t, live.ID)

	scope := region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: "eu-west", NetworkID: "net-acme-web-eu"}
	plant := func(tags map[string]string) region.Server {
		srv, err := e.probe.CreateServer(bg, region.ServerSpec{Scope: scope, Name: "stray", FlavorID: "g1.small", ImageID: "ubuntu-24.04", Tags: tags})
		if err != nil {
			t.Fatal(err)
		}
		return srv
	}
	orphan := plant(map[string]string{region.InstanceTag: uuid.NewString()})
	untagged := plant(nil)

	eventually.Holds(t, 10*time.Second, func() bool {
		_, err := e.probe.GetServer(bg, orphan.ID)
		return errors.Is(err, region.ErrServerNotFound)
	}, "the orphaned server %s deleted", orphan.ID)
	if n := metrictest.Value(t, e.reg, "computeql_region_orphan_servers_deleted_total"); n != 1 {
		t.Errorf("computeql_region_orphan_servers_deleted_total = %v, want 1", n)
	}
	if _, err := e.probe.GetServer(bg, untagged.ID); err != nil {
		t.Errorf("the untagged server: %v, want it left alone", err)
	}
	servers, err := e.probe.FindServers(bg, scope, region.InstanceTag, live.ID)
	if err != nil || len(region.Live(servers)) != 1 {
		t.Errorf("the live instance's servers: %v (%v), want its one server left alone", servers, err)
	}
}
