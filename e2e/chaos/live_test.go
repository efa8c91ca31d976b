package chaos

import (
	"context"
	"strings"
	"testing"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
)

// TestCheckerOnALiveDeployment shows that what the checker reads from a real deployment is
// what its checks judge: with no worker running, an instance that cannot settle, its waiting
// work and its missing server; once a worker settled it, a stray server and a quota drift
// written into Redis behind the system's back.
func TestCheckerOnALiveDeployment(t *testing.T) {
	r := harness.StartRedis(t)
	d := harness.NewDeployment(t, r, harness.Options{Args: []string{"--build-delay", buildDelay}})
	api := d.API(t)
	client := api.Client(t, d.Token(t, "--subject", "chaos-admin", "--grant", "acme=admin", "--grant", "globex=admin"))
	ledger := NewLedger()
	c := &Checker{API: client, Redis: r.Client, Organizations: Organizations, Ledger: ledger}
	ctx, cancel := context.WithTimeout(context.Background(), stepLimit)
	defer cancel()
	(&Load{Clients: []*harness.Client{client}, Ledger: ledger, Ops: 1, Rate: 50, Actors: 1}).Run(ctx)

	wantViolations := func(wants ...string) {
		t.Helper()
		s, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := summarize(c.Check(s))
		for _, want := range wants {
			if !strings.Contains(got, want) {
				t.Errorf("violations:\n%s\nwant one saying %q", got, want)
			}
		}
	}
	wantViolations("is not settled: PENDING", "computeql_queue_depth is 1, want 0", "has 0 backing servers")

	d.Worker(t)
	c.Settle(t, stepLimit)
	cloud, err := sim.New(r.Client, sim.Options{Catalog: region.Demo()})
	if err != nil {
		t.Fatal(err)
	}
	stray := region.ServerSpec{Scope: region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: "eu-west", NetworkID: "net-acme-web-eu"},
		Name: "stray", FlavorID: "g1.small", ImageID: "ubuntu-24.04", Tags: map[string]string{region.InstanceTag: "nobody"}}
	if _, err := cloud.CreateServer(ctx, stray); err != nil {
		t.Fatal(err)
	}
	if err := r.Client.HIncrBy(ctx, "cq:{o:acme}:quota", "used:cpus", 1).Err(); err != nil {
		t.Fatal(err)
	}
	wantViolations(`instance tag "nobody") belongs to no instance`, "acme uses 3 cpus by its quota, its instances are charged 2")
}
