package queue

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// helperRedisEnv carries the redis-server address to a worker process re-executed from the
// test binary; its presence is what makes TestHelperProcess a worker.
const helperRedisEnv = "QUEUE_HELPER_REDIS"

// helperShards is the shard count the parent and the worker process agree on.
const helperShards = 4

// TestHelperProcess is not a test: it is the worker process TestCrashedWorkerMessageFinishedByAnother
// starts and kills. Run without QUEUE_HELPER_REDIS (as in every normal test run) it returns at
// once. As a worker it consumes the queue with a handler that announces "started <key>" on
// stdout and then never returns, so that the process dies mid-handler when it is killed.
func TestHelperProcess(t *testing.T) {
	addr := os.Getenv(helperRedisEnv)
	if addr == "" {
		return
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	q, err := New(rdb, Options{Shards: helperShards})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	c, err := q.NewConsumer(HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		fmt.Printf("started %s attempt %d\n", task.Key, task.Attempt)
		select {} // mid-handler until SIGKILL
	}), testConsumerOptions(ConsumerOptions{Name: "doomed", Lease: 300 * time.Millisecond}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	_ = c.Start(context.Background())
	os.Exit(3) // Start never returns: its context never ends
}

// Semantics 2: a worker killed with SIGKILL mid-handler leaves its message pending; another
// consumer reclaims it once it has gone unrenewed for the lease, finishes it, and the dead
// worker's delivery counts toward the key's attempts.
func TestCrashedWorkerMessageFinishedByAnother(t *testing.T) {
	rdb, q := newTestQueue(t, Options{Shards: helperShards})
	ctx := context.Background()
	if err := q.Enqueue(ctx, "victim"); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperRedisEnv+"="+redisServer.Addr)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	started := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "started ") {
				started <- line
				return
			}
		}
		close(started)
	}()
	line := waitFor(t, started, "the worker process to start handling")
	if line != "started victim attempt 1" {
		t.Fatalf("worker printed %q", line)
	}
	if err := cmd.Process.Signal(os.Kill); err != nil {
		t.Fatal(err)
	}
	killed = true
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("worker exited with %v, want killed", err)
	}
	shard := q.Shard("victim")
	if n := pendingCount(t, rdb, q, shard); n != 1 {
		t.Fatalf("after the kill %d messages are pending, want the dead worker's 1", n)
	}

	handled := make(chan Task, 10)
	survivor := startConsumer(t, q, HandlerFunc(func(ctx context.Context, task Task) (time.Duration, error) {
		handled <- task
		return 0, nil
	}), ConsumerOptions{Name: "survivor", Lease: 300 * time.Millisecond})
	task := waitFor(t, handled, "the survivor to handle the key")
	if task.Key != "victim" || task.Attempt != 2 {
		t.Errorf("survivor handled %+v, want victim at attempt 2 (the dead worker's delivery counted)", task)
	}
	waitIdle(t, q, "victim")
	if n := rdb.XLen(ctx, streamKey(shard)).Val(); n != 0 {
		t.Errorf("stream keeps %d entries", n)
	}
	if n := pendingCount(t, rdb, q, shard); n != 0 {
		t.Errorf("%d messages still pending", n)
	}
	if n := rdb.HLen(ctx, attemptsKey(shard)).Val(); n != 0 {
		t.Errorf("attempts not reset after success: %v", rdb.HGetAll(ctx, attemptsKey(shard)).Val())
	}
	if n := counterValue(t, survivor.c.metrics.reclaimed); n != 1 {
		t.Errorf("reclaimed = %v, want 1", n)
	}
	survivor.stop()
	select {
	case extra := <-handled:
		t.Errorf("key handled again: %+v", extra)
	default:
	}
}
