package libvirt_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
	"github.com/computeql/computeql/virttest"
)

// BenchmarkLibvirtBoot measures how long a real guest takes from CreateServer to RUNNING
// (its DHCP lease seen) and to answering HTTP on its address, for 1 and 4 created at once on a
// private libvirtd, under the acceleration the host allows (TCG here). It reports seconds as
// the metrics s-to-running and s-to-answer (the slowest of the batch), not ns/op.
// The simulator's figure, with make run's build delay, is measured beside it.
// Run: make bench-virt (or: COMPUTEQL_IMAGES_DIR=$PWD/images go test -run='^$' -bench=LibvirtBoot -benchtime=3x ./region/libvirt/).
func BenchmarkLibvirtBoot(b *testing.B) {
	if os.Getenv(ImagesEnv) == "" || virttest.Available() != nil {
		b.Skip("needs the guest images ($" + ImagesEnv + ") and libvirtd with QEMU")
	}
	kernel, initrd := busybox(b)
	host := virttest.Start(b, virttest.Options{})
	cat := labCatalog(b, host, kernel, initrd)
	d := startDriver(b, cat)
	for _, batch := range []int{1, 4} {
		b.Run(fmt.Sprintf("driver=libvirt/instances=%d", batch), func(b *testing.B) {
			var toRunning, toAnswer time.Duration
			for b.Loop() {
				r, a := bootBatch(b, d, host, batch)
				toRunning, toAnswer = toRunning+r, toAnswer+a
			}
			b.ReportMetric(toRunning.Seconds()/float64(b.N), "s-to-running")
			b.ReportMetric(toAnswer.Seconds()/float64(b.N), "s-to-answer")
			b.ReportMetric(0, "ns/op")
		})
	}
	// The simulator as make run starts it (a 2 s build), measured the same way: the figure a
	// user of the demo sees, beside the real one.
	cloud, err := sim.New(redisServer.Client(b), sim.Options{Catalog: cat, BuildDelay: 2 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	clock := make(chan error, 1)
	go func() { clock <- cloud.Run(ctx) }()
	defer func() { cancel(); <-clock }()
	for _, batch := range []int{1, 4} {
		b.Run(fmt.Sprintf("driver=sim/instances=%d", batch), func(b *testing.B) {
			var toRunning time.Duration
			for b.Loop() {
				r, _ := bootBatch(b, cloud, nil, batch)
				toRunning += r
			}
			b.ReportMetric(toRunning.Seconds()/float64(b.N), "s-to-running")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// bootBatch creates the servers at once and returns when the slowest ran and answered; it
// deletes them before returning.
func bootBatch(b *testing.B, d region.Client, host *virttest.Host, batch int) (toRunning, toAnswer time.Duration) {
	ctx := context.Background()
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range batch {
		wg.Go(func() {
			spec := labSpec("bench")
			srv, err := d.CreateServer(ctx, spec)
			if err != nil {
				b.Error(err)
				return
			}
			defer d.DeleteServer(ctx, srv.ID)
			deadline := time.Now().Add(3 * time.Minute)
			for srv.State != region.ServerRunning && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond) // measurement resolution, not synchronisation
				if srv, err = d.GetServer(ctx, srv.ID); err != nil {
					b.Error(err)
					return
				}
			}
			running := time.Since(start)
			if host == nil { // a simulated server has no guest to answer
				mu.Lock()
				toRunning = max(toRunning, running)
				mu.Unlock()
				return
			}
			client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
				DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
					return host.Dial(ctx, network, addr)
				},
			}}
			for time.Now().Before(deadline) {
				resp, err := client.Get("http://" + srv.PrivateIP + "/")
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						break
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			answered := time.Since(start)
			mu.Lock()
			toRunning, toAnswer = max(toRunning, running), max(toAnswer, answered)
			mu.Unlock()
		})
	}
	wg.Wait()
	return toRunning, toAnswer
}
