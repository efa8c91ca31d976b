package libvirt

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/region"
)

// In a region of several hosts, each host has a record in Redis of the instances that may have
// a server on it (hostInstancesKey): a sorted set of instance ids, each scored by when it was
// last added (Unix seconds), and the member seenMember once a process has listed the host's
// domains into it. While a host cannot be reached, it is what tells FindServers that an
// instance's server may be there, so that no second one is made elsewhere:
//
//   - an instance is added before its server is made on the host, and again once it is;
//   - every process that connects to the host adds the instances of the domains it lists
//     (without renewing their scores), then seenMember: until a process has, the host is taken
//     to hold anything;
//   - an instance is removed once the host holds no server of it, as this process knows: after
//     a delete, unless it was added in the last recentlyAdded (another process may be making a
//     server of it, whose domain this process has not heard of yet), and by each connect and
//     collection pass, once added more than orphanAge ago.
const (
	seenMember    = ""
	recentlyAdded = 10 * time.Second
)

// removeUnlessRecent removes an instance (ARGV[1]) from a host's record (KEYS[1]) when it was
// added before ARGV[2], in one step, so that an add just made is never undone.
var removeUnlessRecent = redis.NewScript(`
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if at and tonumber(at) < tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
`)

// addInstance records that the host may hold a server of the instance, from now.
func (d *hostDriver) addInstance(ctx context.Context, instanceID string) error {
	if d.instancesKey == "" || instanceID == "" {
		return nil
	}
	at := float64(d.opts.Now().Unix())
	if err := d.opts.Redis.ZAdd(ctx, d.instancesKey, redis.Z{Score: at, Member: instanceID}).Err(); err != nil {
		return fmt.Errorf("record the host of instance %s: %v: %w", instanceID, err, region.ErrUnavailable)
	}
	return nil
}

// removeInstance records that the host holds no server of the instance, unless this process
// sees one there or it was added more recently than before.
func (d *hostDriver) removeInstance(ctx context.Context, instanceID string, before time.Time) error {
	if d.instancesKey == "" || instanceID == "" || d.index.tagged(region.InstanceTag, instanceID) {
		return nil
	}
	err := removeUnlessRecent.Run(ctx, d.opts.Redis, []string{d.instancesKey}, instanceID, before.Unix()).Err()
	if err != nil {
		return fmt.Errorf("forget the host of instance %s: %v: %w", instanceID, err, region.ErrUnavailable)
	}
	return nil
}

// mayHold reports whether the host, which cannot be reached, may hold a server with the tag:
// this process last saw one there, its record has the instance, or no process has ever listed
// the host's domains into its record. Only the instance tag is recorded, so for any other tag
// the host may.
func (d *hostDriver) mayHold(ctx context.Context, tag, value string) (bool, error) {
	if tag != region.InstanceTag || d.index.tagged(tag, value) {
		return true, nil
	}
	scores, err := d.opts.Redis.ZMScore(ctx, d.instancesKey, value, seenMember).Result()
	if err != nil {
		return false, fmt.Errorf("the hosts of instance %s: %v: %w", value, err, region.ErrUnavailable)
	}
	// go-redis reads a missing member's score as 0; every score of ours is a time.
	held, seen := scores[0] != 0, scores[1] != 0
	return held || !seen, nil
}

// recordInstances adds the instances of the servers the host holds to its record, as a process
// connects: the host is the truth, and servers made before the region had several hosts are
// recorded too. Instances recorded already keep their scores.
func (d *hostDriver) recordInstances(ctx context.Context, servers []indexed) error {
	if d.instancesKey == "" {
		return nil
	}
	at := float64(d.opts.Now().Unix())
	members := []redis.Z{}
	for _, s := range servers {
		if id := s.tags[region.InstanceTag]; id != "" {
			members = append(members, redis.Z{Score: at, Member: id})
		}
	}
	pipe := d.opts.Redis.Pipeline()
	if len(members) > 0 {
		pipe.ZAddNX(ctx, d.instancesKey, members...)
	}
	pipe.ZAdd(ctx, d.instancesKey, redis.Z{Score: at, Member: seenMember})
	_, err := pipe.Exec(ctx)
	return err
}

// forgetInstances removes from the host's record the instances added more than orphanAge ago
// of which the host holds no server (as its index, just read from it or kept by its events,
// says): creates that failed before making a domain, servers deleted behind our back or by a
// delete that could not remove them.
func (d *hostDriver) forgetInstances(ctx context.Context) (int, error) {
	if d.instancesKey == "" {
		return 0, nil
	}
	before := d.opts.Now().Add(-orphanAge)
	old, err := d.opts.Redis.ZRangeByScore(ctx, d.instancesKey, &redis.ZRangeBy{Min: "-inf", Max: "(" + strconv.FormatInt(before.Unix(), 10)}).Result()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range old {
		if id == seenMember || d.index.tagged(region.InstanceTag, id) {
			continue
		}
		if err := d.removeInstance(ctx, id, before); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// instanceOf is the instance of a server on the host, from the index or else the host: "" when
// neither has it.
func (d *hostDriver) instanceOf(id string) string {
	if s, ok := d.index.get(id); ok {
		return s.tags[region.InstanceTag]
	}
	conn, err := d.host("")
	if err != nil {
		return ""
	}
	s, err := d.lookup(conn, id)
	if err != nil {
		return ""
	}
	return s.rec.Spec.Tags[region.InstanceTag]
}
