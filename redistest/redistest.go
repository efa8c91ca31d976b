// Package redistest starts a real redis-server for a test package: on a free loopback port,
// with its own temporary directory, owned and stopped by the package's TestMain. Tests never
// talk to a shared server or a mock of Redis.
package redistest

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/redisproc"
)

// Server is a redis-server process started for tests.
type Server struct {
	*redisproc.Server
}

// Start launches redis-server on a free loopback port with a fresh directory and waits until it
// answers PING. extraArgs are passed to redis-server (e.g. "--appendonly", "yes").
func Start(extraArgs ...string) (*Server, error) {
	s, err := redisproc.Start(extraArgs...)
	if err != nil {
		return nil, err
	}
	return &Server{s}, nil
}

// Client returns a client of the server whose database has been flushed, so each test starts
// from an empty store; it is closed when the test ends.
func (s *Server) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	if err := c.FlushAll(context.Background()).Err(); err != nil {
		tb.Fatalf("redistest: flush: %v", err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// Main runs a test package with a redis-server started for it and stored in *srv, and exits
// with the tests' result. Call it from TestMain.
func Main(m *testing.M, srv **Server) {
	s, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*srv = s
	code := m.Run()
	s.Stop()
	os.Exit(code)
}

// UsedMemory returns the server's used_memory, in bytes: what its data costs it.
func UsedMemory(tb testing.TB, c redis.UniversalClient) int64 {
	tb.Helper()
	info, err := c.InfoMap(context.Background(), "memory").Result()
	if err != nil {
		tb.Fatal(err)
	}
	n, err := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// State returns every key of the database with its content, to show that a refusal wrote
// nothing. Content is read by type (a hash's fields and values, a sorted set's members and
// scores, a stream's entries…), not with DUMP, whose bytes follow a hash's internal order,
// which even a read may change while Redis rehashes it.
func State(tb testing.TB, c *redis.Client) map[string]string {
	tb.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		tb.Fatalf("redistest: KEYS: %v", err)
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		typ, err := c.Type(ctx, k).Result()
		if err != nil {
			tb.Fatalf("redistest: TYPE %s: %v", k, err)
		}
		var v any
		switch typ {
		case "string":
			v, err = c.Get(ctx, k).Result()
		case "hash":
			v, err = c.HGetAll(ctx, k).Result()
		case "zset":
			v, err = c.ZRangeWithScores(ctx, k, 0, -1).Result()
		case "set":
			var m []string
			if m, err = c.SMembers(ctx, k).Result(); err == nil {
				slices.Sort(m)
				v = m
			}
		case "list":
			v, err = c.LRange(ctx, k, 0, -1).Result()
		case "stream":
			v, err = c.XRange(ctx, k, "-", "+").Result()
		default:
			v, err = c.Dump(ctx, k).Result()
		}
		if err != nil {
			tb.Fatalf("redistest: read %s (%s): %v", k, typ, err)
		}
		out[k] = typ + " " + fmt.Sprint(v)
	}
	return out
}

// RoundTrips is a client hook that counts round trips to Redis, one per command or pipeline
// sent, and the commands they carried, leaving out a new connection's handshake (HELLO and
// the CLIENT SETINFO pipeline), which is the pool's cost, not the caller's.
type RoundTrips struct{ n, commands atomic.Int64 }

// N is how many round trips were counted.
func (h *RoundTrips) N() int64 { return h.n.Load() }

// Commands is how many commands those round trips carried.
func (h *RoundTrips) Commands() int64 { return h.commands.Load() }

// DialHook implements redis.Hook.
func (h *RoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "hello" {
			h.n.Add(1)
			h.commands.Add(1)
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (h *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() != "client" {
			h.n.Add(1)
			h.commands.Add(int64(len(cmds)))
		}
		return next(ctx, cmds)
	}
}
