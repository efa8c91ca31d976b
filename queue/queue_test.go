package queue

import (
	"context"
	"fmt"
	"testing"

	"github.com/computeql/computeql/redistest"
)

var redisServer *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &redisServer) }

func TestEnqueueAppendsToTheKeysShard(t *testing.T) {
	rdb := redisServer.Client(t)
	q, err := New(rdb, Options{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	counts := map[int]int64{}
	for i := range 40 {
		key := fmt.Sprint("acme/", i)
		if err := q.Enqueue(ctx, key); err != nil {
			t.Fatal(err)
		}
		if q.Shard(key) != q.Shard(key) {
			t.Fatal("shard is not stable")
		}
		counts[q.Shard(key)]++
	}
	if len(counts) < 2 {
		t.Errorf("40 keys all went to one shard: %v", counts)
	}
	for shard, want := range counts {
		if got := rdb.XLen(ctx, StreamKey(shard)).Val(); got != want {
			t.Errorf("shard %d has %d entries, want %d", shard, got, want)
		}
	}
	msgs := rdb.XRange(ctx, StreamKey(q.Shard("acme/7")), "-", "+").Val()
	found := false
	for _, m := range msgs {
		found = found || m.Values["k"] == "acme/7"
	}
	if !found {
		t.Error("acme/7 not in its shard's stream")
	}
}

func TestShardCountIsValidated(t *testing.T) {
	for _, n := range []int{-1, 1025} {
		if _, err := New(nil, Options{Shards: n}); err == nil {
			t.Errorf("Shards %d accepted", n)
		}
	}
}
