package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/eventually"
)

// Redis is a redis-server with an append-only file that the test kills (SIGKILL, as a crash or
// an OOM kill would end it) and starts again on the same port and data directory, so that the
// processes of a deployment find it where they left it and it reloads what it had written.
// It is stopped when the test ends.
type Redis struct {
	// Addr is its host:port, the same across restarts.
	Addr string
	// Fsync is its appendfsync policy: always or everysec.
	Fsync string
	dir   string
	bin   string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the current run exited
}

// redisStartLimit bounds a start: loading a few megabytes of append-only file takes well
// under a second.
const redisStartLimit = 30 * time.Second

// StartRedis starts a redis-server on a free loopback port with appendonly on and the fsync
// policy, in a temporary directory of the test.
func StartRedis(tb testing.TB, fsync string) *Redis {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("chaos: redis-server is not installed (apt-get install -y redis-server): %v", err)
	}
	r := &Redis{Fsync: fsync, dir: tb.TempDir(), bin: bin}
	tb.Cleanup(r.stop)
	// A free port can be taken before redis-server binds it; then it exits and another is tried.
	for attempt := 1; ; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		r.Addr = l.Addr().String()
		l.Close()
		err = r.start()
		if err == nil {
			return r
		}
		if attempt == 3 {
			tb.Fatal(err)
		}
	}
}

func (r *Redis) start() error {
	_, port, _ := net.SplitHostPort(r.Addr)
	cmd := exec.Command(r.bin, "--port", port, "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", r.Fsync,
		"--logfile", filepath.Join(r.dir, "redis.log"))
	cmd.SysProcAttr = harness.ProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chaos: start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()
	return r.waitReady(done)
}

// waitReady waits until the server answers PING, which it does only once it has loaded its
// append-only file (before, it answers LOADING), or exits.
func (r *Redis) waitReady(exited <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(redisStartLimit)
	for {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			return fmt.Errorf("chaos: redis-server on %s exited at start:\n%s", r.Addr, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: redis-server on %s not ready within %s: %w", r.Addr, redisStartLimit, err)
		}
		time.Sleep(10 * time.Millisecond) // redis-server has no other signal that it is ready
	}
}

// Kill ends the server with SIGKILL and waits until it is gone: whatever it had not written
// to its append-only file is lost, as in a crash.
func (r *Redis) Kill(tb testing.TB) {
	tb.Helper()
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		tb.Fatalf("chaos: kill redis-server: %v", err)
	}
	<-done
}

// Restart starts the killed server again on the same port and directory and waits until it
// has loaded its data.
func (r *Redis) Restart(tb testing.TB) {
	tb.Helper()
	if err := r.start(); err != nil {
		tb.Fatal(err)
	}
}

func (r *Redis) stop() {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Harness returns the server as the harness's deployments take it: the processes' URL, and a
// client of the test's own, closed when the test ends, that reconnects after a restart.
func (r *Redis) Harness(tb testing.TB) *harness.Redis {
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	tb.Cleanup(func() { c.Close() })
	return &harness.Redis{URL: "redis://" + r.Addr + "/0", Client: c, Addrs: []string{r.Addr}}
}

// Ready waits until every process of the deployment answers /readyz again, which each does
// only when its own Redis client reaches Redis: the evidence that it reconnected by itself.
func Ready(tb testing.TB, limit time.Duration, procs ...*harness.Process) {
	tb.Helper()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	for _, p := range procs {
		eventually.Holds(tb, limit, func() bool {
			resp, err := client.Get(p.URL() + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}, "%s answers /readyz again", p.Name)
	}
}
