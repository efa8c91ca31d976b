package deployment

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/eventually"
)

// TestClusterWithANodeDownIsUnavailable: with a master of a 3-master Redis Cluster gone, once
// the others have marked it failed the cluster answers CLUSTERDOWN, a state that passes (a
// replica would be promoted, or the node restarted): the API answers its callers UNAVAILABLE,
// never INTERNAL, for reads and writes alike.
func TestClusterWithANodeDownIsUnavailable(t *testing.T) {
	t.Parallel()
	r := harness.StartCluster(t, 3)
	d := harness.NewDeployment(t, r, harness.Options{})
	api := d.API(t)
	c := api.Client(t, d.Token(t, "--subject", "ops", "--grant", "acme=admin"))
	ctx := context.Background()
	if err := c.Do(ctx, `{ instances(organizationId: "acme") { totalCount } }`, nil, nil); err != nil {
		t.Fatalf("before the node goes: %v", err)
	}

	// The node that goes is not acme's: acme's keys stay on a live node, which answers
	// CLUSTERDOWN rather than the connection being refused.
	owner := nodeOf(ctx, t, r, "{o:acme}")
	down := (owner + 1) % len(r.Nodes)
	r.Nodes[down].Stop()
	survivor := redis.NewClient(&redis.Options{Addr: r.Addrs[owner]})
	t.Cleanup(func() { survivor.Close() })
	eventually.Holds(t, time.Minute, func() bool {
		info, err := survivor.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:fail")
	}, "the surviving masters mark the cluster failed")

	if err := survivor.Get(ctx, "{o:acme}:probe").Err(); !redis.IsClusterDownError(err) {
		t.Fatalf("acme's node answers %v, want CLUSTERDOWN: the test shows nothing", err)
	}
	for name, op := range map[string]string{
		"read":  `{ instances(organizationId: "acme") { totalCount } }`,
		"write": `mutation { createInstance(input: {organizationId: "acme", projectId: "web", networkId: "net-acme-web-eu", name: "down", flavorId: "g1.small", imageId: "ubuntu-24.04"}) { instance { id } } }`,
	} {
		err := c.Do(ctx, op, nil, nil)
		var gqlErrs harness.Errors
		if !errors.As(err, &gqlErrs) || gqlErrs[0].Code() != "UNAVAILABLE" {
			t.Errorf("%s with a node down: %v, want UNAVAILABLE", name, err)
		}
	}
}

// nodeOf returns the index among r.Nodes of the node serving the key's slot.
func nodeOf(ctx context.Context, t *testing.T, r *harness.Redis, key string) int {
	t.Helper()
	c := r.Client.(*redis.ClusterClient)
	slot, err := c.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) {
			for i, addr := range r.Addrs {
				if s.Nodes[0].Addr == addr {
					return i
				}
			}
		}
	}
	t.Fatalf("no node serves slot %d", slot)
	return 0
}
