package sim

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/region"
)

// BenchmarkCreateServer measures one create on a /16. The state is flushed every 1,000 creates
// (off the clock), so the figure is that of a network about 500 servers full rather than one
// that fills up with the benchmark's iterations.
func BenchmarkCreateServer(b *testing.B) {
	e := newEnv(b)
	s := e.sim(Options{Catalog: tinyCatalog(b)})
	ctx := context.Background()
	sp := specOn("big", "inst")
	n := 0
	for b.Loop() {
		if n++; n%1000 == 0 {
			b.StopTimer()
			if err := e.rdb.FlushDB(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		if _, err := s.CreateServer(ctx, sp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAdvance1000 measures the clock applying 1,000 due transitions (BUILDING → RUNNING),
// in the batches of dueBatch one tick takes.
func BenchmarkAdvance1000(b *testing.B) {
	const n = 1000
	e := newEnv(b)
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	s := e.sim(Options{Catalog: tinyCatalog(b), Now: func() time.Time { return now }})
	ctx := context.Background()
	servers := make([]region.Server, n)
	for i := range servers {
		servers[i] = region.Server{
			ID: fmt.Sprintf("srv-%d", i), ServerSpec: specOn("big", fmt.Sprintf("inst-%d", i)),
			State: region.ServerBuilding, Health: region.HealthUnknown, PrivateIP: fmt.Sprintf("10.128.%d.%d", i/200, 10+i%200),
			MAC: randomMAC(), CreatedAt: now,
		}
	}
	for b.Loop() {
		b.StopTimer()
		if err := e.rdb.FlushDB(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		if _, err := e.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			for _, srv := range servers {
				s.write(ctx, p, srv, region.ServerUpdated, now)
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for range (n + dueBatch - 1) / dueBatch {
			if err := s.advance(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if left, err := e.rdb.ZCard(ctx, dueKey).Result(); err != nil || left != 0 {
			b.Fatalf("%d transitions left (err %v)", left, err)
		}
		b.StartTimer()
	}
}
