package harness

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/redistest"
)

// Redis is the Redis a deployment shares: one redis-server, or a Redis Cluster of masters.
type Redis struct {
	// URL reaches it as the processes' --redis flag takes it.
	URL string
	// Client is the test's own client of it: a *redis.ClusterClient for a cluster.
	Client redis.UniversalClient
	// Addrs are the servers' host:port.
	Addrs []string
	// Nodes are a cluster's servers, which a test may stop to take a node down.
	Nodes []*redistest.Server
}

// StartRedis starts a redis-server on a free loopback port for the test, stopped when it ends;
// extraArgs go to redis-server.
func StartRedis(tb testing.TB, extraArgs ...string) *Redis {
	tb.Helper()
	s, err := redistest.Start(extraArgs...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	tb.Cleanup(func() { c.Close() })
	return &Redis{URL: "redis://" + s.Addr + "/0", Client: c, Addrs: []string{s.Addr}}
}

// clusterTimeout bounds forming a cluster: redis-cli waits for the nodes to agree on the
// configuration, which takes a few gossip rounds.
const clusterTimeout = 30 * time.Second

// StartCluster starts a Redis Cluster of masters (no replicas) on free loopback ports for the
// test and waits until every node reports it healthy with every slot served; it is stopped when
// the test ends. It needs redis-cli, which Debian's redis-server package brings along.
func StartCluster(tb testing.TB, masters int) *Redis {
	tb.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		tb.Fatalf("harness: a Redis Cluster needs redis-cli (apt-get install -y redis-tools): %v", err)
	}
	r := &Redis{}
	nodes := make([]*redis.Client, masters)
	for i := range masters {
		s := startClusterNode(tb)
		r.Addrs, r.Nodes = append(r.Addrs, s.Addr), append(r.Nodes, s)
		nodes[i] = redis.NewClient(&redis.Options{Addr: s.Addr})
		tb.Cleanup(func() { nodes[i].Close() })
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, r.Addrs...)
	cmd := exec.CommandContext(ctx, cli, append(args, "--cluster-replicas", "0", "--cluster-yes")...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		tb.Fatalf("harness: redis-cli --cluster create: %v\n%s", err, out.Bytes())
	}
	// redis-cli returns once the nodes agree on the slots; each node still has to see itself
	// and the others as healthy before it serves every slot.
	var last string
	eventually.Holds(tb, clusterTimeout, func() bool {
		for _, n := range nodes {
			info, err := n.ClusterInfo(ctx).Result()
			if err != nil {
				last = err.Error()
				return false
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") ||
				!strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(masters)) {
				last = info
				return false
			}
		}
		return true
	}, "every node of the cluster reports it ok (last: %v)", eventually.Lazy(func() string { return last }))
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: r.Addrs})
	tb.Cleanup(func() { c.Close() })
	r.Client = c
	r.URL = "redis+cluster://" + strings.Join(r.Addrs, ",")
	return r
}

// startClusterNode starts one redis-server in cluster mode. Its cluster bus needs a second
// free port; losing the race for it makes the server exit, and another port is tried.
func startClusterNode(tb testing.TB) *redistest.Server {
	tb.Helper()
	var lastErr error
	for range 5 {
		bus, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		s, err := redistest.Start("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(bus), "--cluster-node-timeout", "5000")
		if err == nil {
			tb.Cleanup(s.Stop)
			return s
		}
		lastErr = err
	}
	tb.Fatalf("harness: start a cluster node: %v", lastErr)
	return nil
}

// Flush empties every master, so that the next deployment starts from nothing. No process of
// the harness may be running: it would keep state (consumer groups, readers' positions) that
// the flush removes under it.
func (r *Redis) Flush(tb testing.TB) {
	tb.Helper()
	ctx := context.Background()
	var err error
	if c, ok := r.Client.(*redis.ClusterClient); ok {
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.FlushAll(ctx).Err() })
	} else {
		err = r.Client.FlushAll(ctx).Err()
	}
	if err != nil {
		tb.Fatalf("harness: flush redis: %v", err)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("harness: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
