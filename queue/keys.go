package queue

import (
	"slices"
	"strconv"
)

// Every key of one shard carries the hash tag {q<shard>}, so each shard's scripts touch one
// Redis Cluster slot and different shards can live on different nodes.

func shardTag(shard int) string { return "{q" + strconv.Itoa(shard) + "}" }

// streamKey is the shard's work stream: one entry per key waiting or being handled.
func streamKey(shard int) string { return "cq:" + shardTag(shard) + ":s" }

// stateKey is a hash of key → "q<message id>" (a message waits), "Q<message id>" (a message
// waits, and the key has earlier failed deliveries), "a<fence>" (being handled by the run
// holding the fence), "d<fence>" (being handled and added again meanwhile), "s" (idle and
// scheduled) or "f" (idle, scheduled, with earlier failed deliveries). A key absent from it is
// idle and not scheduled.
func stateKey(shard int) string { return "cq:" + shardTag(shard) + ":st" }

// The states of an idle key that is scheduled (stateKey).
const (
	scheduled       = "s"
	scheduledFailed = "f"
)

// attemptsKey is a hash of key → deliveries of the key's messages that failed since it last
// succeeded; the delivery of the message at hand Redis counts itself (XPENDING).
func attemptsKey(shard int) string { return "cq:" + shardTag(shard) + ":at" }

// lastErrorKey is a hash of key → the last error its handler returned.
func lastErrorKey(shard int) string { return "cq:" + shardTag(shard) + ":er" }

// delayedKey is a sorted set of keys to add again, scored by when (Unix milliseconds).
func delayedKey(shard int) string { return "cq:" + shardTag(shard) + ":dl" }

// fenceKey counts deliveries; each handler run gets the next value as its fencing token. On a
// standalone Redis every shard's runs count on shard 0's, so that a call that begins messages
// of several shards takes their tokens with one INCRBY; on a Redis Cluster each shard counts on
// its own (fenceKeyOf).
func fenceKey(shard int) string { return "cq:" + shardTag(shard) + ":f" }

// deadKey is the shard's dead-letter stream.
func deadKey(shard int) string { return "cq:" + shardTag(shard) + ":dead" }

// shardKeys are one shard's KEYS in each kind of script call the hot paths make, built once
// per queue rather than for every call. Each slice is clipped, so that appending to it copies.
type shardKeys struct {
	enqueue, begin, take, finish []string
}

func newShardKeys(shard int, fence string) shardKeys {
	return shardKeys{
		enqueue: slices.Clip([]string{streamKey(shard), stateKey(shard), delayedKey(shard)}),
		begin:   slices.Clip(beginShardKeys(shard, fence)),
		take:    slices.Clip(takeShardKeys(shard, fence)),
		finish:  slices.Clip(finishShardKeys(shard)),
	}
}

// beginShardKeys are the KEYS of one shard in a begin script call, with the fence counter its
// runs count on.
func beginShardKeys(shard int, fence string) []string {
	return []string{streamKey(shard), stateKey(shard), attemptsKey(shard), fence, deadKey(shard), lastErrorKey(shard)}
}

// takeShardKeys are the KEYS of one shard in a take script call, with the fence counter its
// runs count on.
func takeShardKeys(shard int, fence string) []string {
	return append(beginShardKeys(shard, fence), delayedKey(shard))
}

// finishShardKeys are the KEYS of one shard in a finish script call.
func finishShardKeys(shard int) []string {
	return []string{streamKey(shard), stateKey(shard), attemptsKey(shard), delayedKey(shard), lastErrorKey(shard)}
}

// buryShardKeys are the KEYS of the bury script.
func buryShardKeys(shard int) []string {
	return []string{streamKey(shard), stateKey(shard), attemptsKey(shard), deadKey(shard), lastErrorKey(shard)}
}
