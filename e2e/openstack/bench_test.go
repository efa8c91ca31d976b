package openstack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"github.com/computeql/computeql/openstacktest"
)

// BenchEnv, set to 1, runs BenchmarkOpenStackCreate (make bench-openstack sets it): without
// it the benchmark skips, so that make test's run of every benchmark once does not start a
// control plane of a minute and more.
const BenchEnv = "COMPUTEQL_BENCH_OPENSTACK"

// benchLimit bounds one batch's wait, far above what it takes.
const benchLimit = 5 * time.Minute

// BenchmarkOpenStackCreate measures the seconds from createInstance to RUNNING through
// computeql (GraphQL, the queue, a worker, the driver's port and server, the watch's poll
// every 500 ms, the subscriber's event) for 1 and for 8 instances created at once, beside the
// seconds Nova alone takes to make the same servers ACTIVE when asked directly (gophercloud's
// create on the same network, flavor and image, polled every 100 ms). Each batch is deleted,
// untimed, before the next.
func BenchmarkOpenStackCreate(b *testing.B) {
	if os.Getenv(BenchEnv) != "1" {
		b.Skipf("starts an OpenStack control plane: run with %s=1 (make bench-openstack)", BenchEnv)
	}
	cloud := openstacktest.Start(b)
	n := connect(b, cloud)
	d := deploy(b, cloud, writeCatalog(b, cloud))
	f := d.follow(b)
	ctx := context.Background()
	round := 0
	for _, batch := range []int{1, 8} {
		b.Run(fmt.Sprintf("instances=%d", batch), func(b *testing.B) {
			var viaComputeQL, viaNova time.Duration
			for b.Loop() {
				round++
				viaComputeQL += d.createBatch(ctx, b, f, fmt.Sprintf("bench-%d", round), batch)
				viaNova += n.createBatch(ctx, b, cloud, fmt.Sprintf("bench-nova-%d", round), batch)
			}
			b.ReportMetric(viaComputeQL.Seconds()/float64(b.N), "s-computeql-to-running")
			b.ReportMetric(viaNova.Seconds()/float64(b.N), "s-nova-to-active")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// createBatch creates count instances at once through GraphQL and returns how long until the
// subscriber saw every one RUNNING; then deletes them and waits until they are gone.
func (d *deployment) createBatch(ctx context.Context, b *testing.B, f *follower, prefix string, count int) time.Duration {
	b.Helper()
	ids := make([]string, count)
	errs := make([]error, count)
	began := time.Now()
	var wg sync.WaitGroup
	for i := range count {
		wg.Go(func() { ids[i], errs[i] = d.tryCreate(ctx, fmt.Sprintf("%s-%d", prefix, i)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	mine := map[string]bool{}
	for _, id := range ids {
		mine[id] = true
	}
	running := map[string]bool{}
	f.until(b, benchLimit, fmt.Sprintf("%d instances RUNNING", count), func(ev event) bool {
		if ev.Instance.running() && mine[ev.Instance.ID] {
			running[ev.Instance.ID] = true
		}
		return len(running) == count
	})
	took := time.Since(began)
	for _, id := range ids {
		d.mustVerb(ctx, b, "deleteInstance", id)
	}
	gone := map[string]bool{}
	f.until(b, benchLimit, fmt.Sprintf("%d instances DELETED", count), func(ev event) bool {
		if ev.Kind == "DELETED" && mine[ev.Instance.ID] {
			gone[ev.Instance.ID] = true
		}
		return len(gone) == count
	})
	return took
}

// createBatch creates count servers at once in Nova directly and returns how long until Nova
// listed every one ACTIVE; then deletes them and waits until Nova lists none.
func (n *nova) createBatch(ctx context.Context, b *testing.B, cloud *openstacktest.Cloud, prefix string, count int) time.Duration {
	b.Helper()
	began := time.Now()
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i := range count {
		wg.Go(func() {
			_, errs[i] = servers.Create(ctx, n.compute, servers.CreateOpts{
				Name: fmt.Sprintf("%s-%d", prefix, i), FlavorRef: cloud.FlavorID, ImageRef: cloud.ImageID,
				Networks: []servers.Network{{UUID: cloud.NetworkID}},
			}, nil).Extract()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatalf("create servers in Nova: %v", err)
	}
	// Nova takes a name filter as a regular expression.
	opts := servers.ListOpts{Name: "^" + prefix + "-"}
	poll(b, "Nova listing the servers ACTIVE", func() (bool, error) {
		list, err := n.list(ctx, opts)
		if err != nil {
			return false, err
		}
		active := 0
		for _, s := range list {
			if s.Status == "ERROR" {
				b.Fatalf("server %s (%s) went ERROR: %v", s.Name, s.ID, s.Fault)
			}
			if s.Status == "ACTIVE" {
				active++
			}
		}
		return active == count, nil
	})
	took := time.Since(began)
	list, err := n.list(ctx, opts)
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range list {
		if err := servers.Delete(ctx, n.compute, s.ID).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
			b.Fatalf("delete server %s: %v", s.ID, err)
		}
	}
	poll(b, "Nova listing the servers gone", func() (bool, error) {
		list, err := n.list(ctx, opts)
		return len(list) == 0, err
	})
	return took
}

func (n *nova) list(ctx context.Context, opts servers.ListOpts) ([]servers.Server, error) {
	pages, err := servers.List(n.compute, opts).AllPages(ctx)
	if err != nil {
		return nil, fmt.Errorf("list servers: %w", err)
	}
	return servers.ExtractServers(pages)
}

// poll asks cond every 100 ms until it is true, failing the benchmark after benchLimit: Nova
// alone has no events to wait on.
func poll(b *testing.B, what string, cond func() (bool, error)) {
	b.Helper()
	deadline := time.Now().Add(benchLimit)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			b.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: not within %s", what, benchLimit)
		}
		<-tick.C
	}
}
