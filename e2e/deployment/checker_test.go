package deployment

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
)

// TestCheckerSeesViolations: the invariant checker the suite trusts fails on each kind of
// breakage, so that its passing means something. A settled deployment loses its worker (so
// nothing repairs what follows), then its state is broken in several ways at once, each of
// which the checker must name.
func TestCheckerSeesViolations(t *testing.T) {
	t.Parallel()
	r := harness.StartRedis(t)
	d := harness.NewDeployment(t, r, harness.Options{Args: []string{"--build-delay", "100ms", "--rate-limit", "-1"}})
	api := d.API(t)
	worker := d.Worker(t)
	admin := api.Client(t, d.Token(t, "--subject", "e2e-admin", "--grant", "acme=admin", "--grant", "globex=admin"))
	ctx := context.Background()
	checker := &harness.Checker{API: admin, Redis: r.Client, Organizations: orgs, AllRunning: true}

	web := projects[0]
	settled := create(ctx, admin, web, "settled", 1)
	if settled.err != nil {
		t.Fatal(settled.err)
	}
	checker.Settled(t, stepLimit)
	if err := worker.Terminate(t); err != nil {
		t.Fatalf("worker did not stop cleanly: %v", err)
	}

	cloud, err := sim.New(r.Client, sim.Options{Catalog: region.Demo()})
	if err != nil {
		t.Fatal(err)
	}
	network, _ := region.Demo().Network(web.networks[1])
	server := func(instanceID string) region.ServerSpec {
		return region.ServerSpec{
			Scope: region.Scope{OrganizationID: web.org, ProjectID: web.id, RegionID: network.Region, NetworkID: network.ID},
			Name:  "intruder", FlavorID: "g1.small", ImageID: "ubuntu-24.04",
			Tags: map[string]string{region.InstanceTag: instanceID},
		}
	}
	var pending result
	breakages := []struct {
		name  string
		do    func() error
		wants []string
	}{
		{"usage drifts from the charges", func() error { return r.Client.HIncrBy(ctx, "cq:{o:acme}:quota", "used:cpus", 3).Err() },
			[]string{"organization acme: quota says", "cpus used"}},
		{"a server without an instance", func() error { _, err := cloud.CreateServer(ctx, server(uuid.NewString())); return err },
			[]string{"belongs to no instance"}},
		{"an instance with two servers", func() error { _, err := cloud.CreateServer(ctx, server(settled.id)); return err },
			[]string{"instance " + settled.id + " (settled-1) has 2 backing servers"}},
		{"a key left in the queue", func() error {
			q, err := queue.New(r.Client, queue.Options{})
			if err != nil {
				return err
			}
			return q.Enqueue(ctx, "acme/"+uuid.NewString())
		}, []string{"computeql_queue_depth is"}},
		{"an instance nobody reconciles", func() error { pending = create(ctx, admin, web, "pending", 2); return pending.err },
			[]string{"(pending-2) is not settled: PENDING", "(pending-2) has 0 backing servers"}},
	}
	for _, b := range breakages {
		if err := b.do(); err != nil {
			t.Fatalf("%s: %v", b.name, err)
		}
	}
	_, err = checker.Check(ctx)
	if err == nil {
		t.Fatal("the checker passed a broken deployment")
	}
	for _, b := range breakages {
		for _, want := range b.wants {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: the checker's report lacks %q:\n%v", b.name, want, err)
			}
		}
	}
}
