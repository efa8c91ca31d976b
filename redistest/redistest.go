// Package redistest starts a real redis-server for a test package: on a free loopback port,
// with its own temporary directory, owned and stopped by the package's TestMain. Tests never
// talk to a shared server or a mock of Redis.
package redistest

import (
	"context"
	"fmt"
	"os"
	"strconv"
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
