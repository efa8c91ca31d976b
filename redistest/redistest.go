// Package redistest starts a real redis-server for a test package: on a free loopback port,
// with its own temporary directory, owned and stopped by the package's TestMain. Tests never
// talk to a shared server or a mock of Redis.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process started for tests.
type Server struct {
	// Addr is host:port of the server.
	Addr string
	dir  string
	cmd  *exec.Cmd
	done chan error
}

// Start launches redis-server on a free loopback port with a fresh directory and waits until it
// answers PING. Picking a free port races with other processes, so a lost race is retried.
// extraArgs are passed to redis-server (e.g. "--appendonly", "yes").
func Start(extraArgs ...string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redistest: redis-server is not installed (apt-get install -y redis-server): %w", err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s, err := start(bin, extraArgs)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func start(bin string, extraArgs []string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "computeql-redis-")
	if err != nil {
		return nil, fmt.Errorf("redistest: temp dir: %w", err)
	}
	args := append([]string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", dir,
		"--save", "",
		"--appendonly", "no",
		"--logfile", filepath.Join(dir, "redis.log"),
	}, extraArgs...)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redistest: start redis-server: %w", err)
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, cmd: cmd, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	if err := s.waitReady(10 * time.Second); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// waitReady polls PING until the server answers, it exits (e.g. the port was taken), or the
// deadline passes. Polling is the only signal redis-server gives that it is listening.
func (s *Server) waitReady(limit time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case err := <-s.done:
			s.done <- err
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redistest: redis-server exited early (%v): %s", err, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("redistest: redis-server did not answer PING in time")
}

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	os.RemoveAll(s.dir)
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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redistest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
