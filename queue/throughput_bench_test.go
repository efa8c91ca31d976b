package queue

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/redisproc"
)

// benchConsumers and benchProducers shape both throughput benchmarks alike, so the ratio of
// their figures is the queue's overhead over the bare stream commands.
const (
	benchConsumers = 4
	benchProducers = 4
)

// BenchmarkEndToEnd: b.N distinct keys enqueued by 4 producers and handled by 4 consumers
// with no-op handlers, until every key is handled.
func BenchmarkEndToEnd(b *testing.B) {
	rdb := redisServer.Client(b)
	q, err := New(rdb, Options{Shards: 16})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := q.Setup(ctx); err != nil {
		b.Fatal(err)
	}
	var handled atomic.Int64
	all := make(chan struct{})
	n := int64(b.N)
	h := HandlerFunc(func(context.Context, Task) (time.Duration, error) {
		if handled.Add(1) == n {
			close(all)
		}
		return 0, nil
	})
	var consumers sync.WaitGroup
	for i := range benchConsumers {
		// Each consumer has its own client, as a worker process would.
		own := redis.NewClient(&redis.Options{Addr: redisServer.Addr})
		defer own.Close()
		cq, err := New(own, Options{Shards: 16})
		if err != nil {
			b.Fatal(err)
		}
		c, err := cq.NewConsumer(h, ConsumerOptions{Name: fmt.Sprint("bench-", i), Concurrency: 4, Block: 50 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		consumers.Go(func() { c.Start(ctx) })
	}
	b.ResetTimer()
	produce(b, func(i int) error { return q.Enqueue(ctx, "k"+strconv.Itoa(i)) })
	<-all
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "keys/s")
	cancel()
	consumers.Wait()
}

// BenchmarkRawStreams is the limit: the same load as bare XADD, XREADGROUP and XACK on 16
// streams read the way the consumers read them (one blocking read over every stream, up to 4
// messages), with no coalescing, leases, fencing or dead letters.
func BenchmarkRawStreams(b *testing.B) {
	rdb := redisServer.Client(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const shards = 16
	for s := range shards {
		rdb.XGroupCreateMkStream(ctx, rawStream(s), "g", "0")
	}
	var handled atomic.Int64
	all := make(chan struct{})
	n := int64(b.N)
	streams := make([]string, 0, 2*shards)
	for s := range shards {
		streams = append(streams, rawStream(s))
	}
	for range shards {
		streams = append(streams, ">")
	}
	var consumers sync.WaitGroup
	for i := range benchConsumers {
		rdb := redis.NewClient(&redis.Options{Addr: redisServer.Addr})
		defer rdb.Close()
		work := make(chan redis.XStream)
		for range 4 {
			consumers.Go(func() {
				for s := range work {
					for _, m := range s.Messages {
						rdb.XAck(ctx, s.Stream, "g", m.ID)
						if handled.Add(1) == n {
							close(all)
						}
					}
				}
			})
		}
		consumers.Go(func() {
			defer close(work)
			for ctx.Err() == nil {
				res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: fmt.Sprint("raw-", i),
					Streams: streams, Count: 4, Block: 50 * time.Millisecond}).Result()
				if err != nil {
					continue
				}
				for _, s := range res {
					work <- s
				}
			}
		})
	}
	b.ResetTimer()
	produce(b, func(i int) error {
		return rdb.XAdd(ctx, &redis.XAddArgs{Stream: rawStream(i % shards), Values: []any{"k", "k" + strconv.Itoa(i)}}).Err()
	})
	<-all
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "keys/s")
	cancel()
	consumers.Wait()
}

func rawStream(shard int) string { return "raw:{" + strconv.Itoa(shard) + "}" }

// produce calls add for 0..b.N-1 from benchProducers goroutines.
func produce(b *testing.B, add func(i int) error) {
	var next atomic.Int64
	var producers sync.WaitGroup
	for range benchProducers {
		producers.Go(func() {
			for i := next.Add(1) - 1; i < int64(b.N); i = next.Add(1) - 1 {
				if err := add(int(i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	producers.Wait()
}

// BenchmarkAdds is the producers' side alone, with no consumer: 4 producers adding b.N
// distinct keys with XADD, the limit, and with Enqueue, whose script checks and records the
// key's state besides. It reports Redis's CPU per add (INFO cpu), where the script's cost
// shows: the end-to-end benchmarks above are bound by how fast the producers' adds return.
func BenchmarkAdds(b *testing.B) {
	adds := []struct {
		name string
		add  func(ctx context.Context, rdb *redis.Client, q *Queue, i int) error
	}{
		{"XADD", func(ctx context.Context, rdb *redis.Client, _ *Queue, i int) error {
			return rdb.XAdd(ctx, &redis.XAddArgs{Stream: rawStream(i % 16), Values: []any{"k", "k" + strconv.Itoa(i)}}).Err()
		}},
		{"Enqueue", func(ctx context.Context, _ *redis.Client, q *Queue, i int) error {
			return q.Enqueue(ctx, "k"+strconv.Itoa(i))
		}},
	}
	for _, a := range adds {
		b.Run(a.name, func(b *testing.B) {
			rdb, q := newTestQueue(b, Options{Shards: 16})
			ctx := b.Context()
			cpu0, err := redisproc.CPU(ctx, rdb)
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			produce(b, func(i int) error { return a.add(ctx, rdb, q, i) })
			b.StopTimer()
			cpu1, err := redisproc.CPU(ctx, rdb)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "adds/s")
			b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "redis-cpu-µs/op")
		})
	}
}
