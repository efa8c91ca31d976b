// Package redisproc runs a real redis-server as a child process: on a free loopback port,
// with its own temporary directory. Tests (through package redistest) and the load tool use
// it; it imports nothing of package testing, so it can be linked into the binary.
package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server child process.
type Server struct {
	// Addr is host:port of the server.
	Addr    string
	dir     string
	cmd     *exec.Cmd
	done    chan error
	stopped sync.Once
}

// Start launches redis-server on a free loopback port with a fresh directory and waits until it
// answers PING. Picking a free port races with other processes, so a lost race is retried.
// extraArgs are passed to redis-server (e.g. "--appendonly", "yes").
func Start(extraArgs ...string) (*Server, error) {
	return StartUnder(nil, extraArgs...)
}

// startLimit is how long a server may take to answer its first PING; under a wrapper, which
// may slow it fifty times (valgrind), startWrappedLimit.
const (
	startLimit        = 10 * time.Second
	startWrappedLimit = time.Minute
)

// StartUnder is Start with redis-server run by a wrapper command, such as valgrind with its
// options: the wrapper's words come first, then redis-server and its arguments.
func StartUnder(wrapper []string, extraArgs ...string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redisproc: redis-server is not installed (apt-get install -y redis-server): %w", err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s, err := start(append(slices.Clip(wrapper), bin), extraArgs)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func start(command, extraArgs []string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "computeql-redis-")
	if err != nil {
		return nil, fmt.Errorf("redisproc: temp dir: %w", err)
	}
	args := append([]string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", dir,
		"--save", "",
		"--appendonly", "no",
		"--logfile", filepath.Join(dir, "redis.log"),
	}, extraArgs...)
	cmd := exec.Command(command[0], append(command[1:], args...)...)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redisproc: start redis-server: %w", err)
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, cmd: cmd, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	limit := startLimit
	if len(command) > 1 {
		limit = startWrappedLimit
	}
	if err := s.waitReady(limit); err != nil {
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
			return fmt.Errorf("redisproc: redis-server exited early (%v): %s", err, log)
		default:
		}
		// A port not yet open is found without go-redis, which would log every refused dial.
		conn, err := net.DialTimeout("tcp", s.Addr, 200*time.Millisecond)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err = c.Ping(ctx).Err()
		cancel()
		// A server loading its data answers LOADING: it listens, which is what is awaited.
		if err == nil || redis.IsLoadingError(err) {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("redisproc: redis-server did not answer PING in time")
}

// Pid is the redis-server process's id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Stop kills the server and removes its directory; calls after the first do nothing, so a
// test may take a server down before its cleanup stops it.
func (s *Server) Stop() {
	s.stopped.Do(func() {
		if s.cmd.Process != nil {
			_ = s.cmd.Process.Kill()
			<-s.done
		}
		os.RemoveAll(s.dir)
	})
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redisproc: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// CPU is the CPU time, user and system, a Redis server has used so far (INFO cpu): the
// benchmarks' measure of the Redis work a load cost.
func CPU(ctx context.Context, c redis.UniversalClient) (time.Duration, error) {
	info, err := c.InfoMap(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	var total time.Duration
	for _, f := range []string{"used_cpu_sys", "used_cpu_user"} {
		s, err := strconv.ParseFloat(info["CPU"][f], 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s: %q", f, info["CPU"][f])
		}
		total += time.Duration(s * float64(time.Second))
	}
	return total, nil
}
