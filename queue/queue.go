// Package queue is the work queue workers consume: opaque keys on sharded Redis Streams. It
// knows nothing of what a key names.
package queue

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Options configure a Queue.
type Options struct {
	// Shards is how many streams keys are spread over. Defaults to 16. Every process must use
	// the same number, because a key's shard is derived from it.
	Shards int
}

// Queue appends keys to their shard's stream.
type Queue struct {
	rdb    redis.UniversalClient
	shards int
}

// New returns a queue on the client with opts' defaults applied.
func New(rdb redis.UniversalClient, opts Options) (*Queue, error) {
	if opts.Shards == 0 {
		opts.Shards = 16
	}
	if opts.Shards < 1 || opts.Shards > 1024 {
		return nil, errors.New("queue: Shards must be between 1 and 1024")
	}
	return &Queue{rdb: rdb, shards: opts.Shards}, nil
}

// Shard returns the shard a key always maps to.
func (q *Queue) Shard(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(q.shards))
}

// StreamKey is the stream of a shard. The shard number is the hash tag, so each shard can
// live on its own Redis Cluster node.
func StreamKey(shard int) string { return "cq:q:{" + strconv.Itoa(shard) + "}" }

// Enqueue appends the key to its shard's stream.
func (q *Queue) Enqueue(ctx context.Context, key string) error {
	err := q.rdb.XAdd(ctx, &redis.XAddArgs{Stream: StreamKey(q.Shard(key)), Values: []any{"k", key}}).Err()
	if err != nil {
		return fmt.Errorf("enqueue %s: %w", key, err)
	}
	return nil
}
