package feed_test

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/computeql/computeql/feed"
	"github.com/computeql/computeql/instance"
)

// BenchmarkFanOut: 10,000 subscribers on one process, each watching one of 1,000 instances
// (ten per instance), and 1,000 events committed at 1,000 a second. It reports the delivery
// latency from the commit to the subscriber (p50, p99) and the heap each idle subscription
// costs the feed (its buffer, its place in the reader's set; the consumer's own goroutine and
// socket are not counted here).
func BenchmarkFanOut(b *testing.B) {
	const instances, perInstance, events = 1000, 10, 1000
	for b.Loop() {
		rdb := redisServer.Client(b)
		ctx, cancel := context.WithCancel(context.Background())
		st := storeOn(rdb)
		f := feed.New(ctx, st, feed.Options{Logger: quiet})
		insts := make([]*instance.Instance, instances)
		for i := range insts {
			insts[i] = createIn(b, st, "acme", "web", i)
		}

		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		subs := make([]*watch, 0, instances*perInstance)
		for _, inst := range insts {
			id := inst.ID
			for range perInstance {
				s, _, err := subscribe(f, ctx, "acme", id, "", func(*instance.Record) bool { return true })
				if err != nil {
					b.Fatal(err)
				}
				subs = append(subs, s)
			}
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		perSub := float64(after.HeapInuse-before.HeapInuse) / float64(len(subs))

		committed := make([]time.Time, events)
		var mu sync.Mutex
		var latencies []time.Duration
		var wg sync.WaitGroup
		timeout := time.After(time.Minute)
		for _, s := range subs {
			wg.Go(func() {
				for n := 0; n < events/instances; n++ {
					r, err := s.await(timeout)
					if err != nil {
						b.Error(err)
						return
					}
					at := time.Now()
					i, _ := strconv.Atoi(r.Message)
					mu.Lock()
					latencies = append(latencies, at.Sub(committed[i]))
					mu.Unlock()
				}
			})
		}
		tick := time.NewTicker(time.Second / events)
		for i := range events {
			<-tick.C
			mu.Lock()
			committed[i] = time.Now()
			mu.Unlock()
			if _, err := st.Warn(ctx, insts[i%instances], time.Now(), strconv.Itoa(i)); err != nil {
				b.Fatal(err)
			}
		}
		tick.Stop()
		wg.Wait()
		for _, s := range subs {
			s.Close()
		}
		cancel()
		f.Wait()

		slices.Sort(latencies)
		b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "p99-ms")
		b.ReportMetric(perSub, "heap-B/subscriber")
		b.ReportMetric(float64(len(latencies)), "deliveries")
	}
}
