package queue

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/computeql/computeql/redistest"
)

var redisServer *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &redisServer) }

func TestSmokeEveryKeyHandledOnce(t *testing.T) {
	rdb := redisServer.Client(t)
	q, err := New(rdb, Options{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := q.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	all := make(chan struct{})
	c, err := q.NewConsumer(HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		mu.Lock()
		defer mu.Unlock()
		seen[task.Key]++
		if len(seen) == 100 {
			close(all)
		}
		return 0, nil
	}), ConsumerOptions{Block: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if err := q.Enqueue(ctx, fmt.Sprint("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error)
	go func() { done <- c.Start(ctx) }()
	select {
	case <-all:
	case <-time.After(20 * time.Second):
		t.Fatalf("only %d keys handled", len(seen))
	}
	cancel()
	<-done
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s handled %d times", k, n)
		}
	}
	for shard := range 4 {
		if n := rdb.XLen(context.Background(), streamKey(shard)).Val(); n != 0 {
			t.Errorf("shard %d stream keeps %d entries", shard, n)
		}
		if n := rdb.HLen(context.Background(), stateKey(shard)).Val(); n != 0 {
			t.Errorf("shard %d state keeps %d keys", shard, n)
		}
	}
}
