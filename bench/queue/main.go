// Command queue-bench measures the work queue (package queue) beside bare Redis Streams
// commands and asynq, on one redis-server it starts itself on a free loopback port: the same
// distinct keys, producers and no-op handlers for each, in interleaved rounds, and prints the
// medians as a markdown table (docs/performance.md, "The work queue beside raw streams and
// asynq"). It is a module of its own so that the product's module does not depend on asynq.
//
//	go run . [-rounds 3] [-keys 50000] [-handlers 4,16] [-producers 4] [-systems raw,ours,asynq]
//	         [-cpuprofile FILE] [-commands]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sys/unix"

	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/redisproc"
)

func main() {
	rounds := flag.Int("rounds", 3, "rounds of every system at every handler count; the table shows medians")
	keys := flag.Int("keys", 50_000, "distinct keys added and handled per run")
	handlerList := flag.String("handlers", "4,16", "comma-separated handler counts, each a column of runs")
	producers := flag.Int("producers", 4, "goroutines adding keys, one add at a time each")
	asynqCheck := flag.Duration("asynq-check-interval", 10*time.Millisecond,
		"asynq's TaskCheckInterval: how long its idle handlers sleep when the queue is empty (asynq polls; its default is 1s)")
	only := flag.String("systems", "raw,ours,asynq", "comma-separated systems to run (raw, ours, asynq); the table shows – for the others")
	cpuProfile := flag.String("cpuprofile", "", "write this process's CPU profile over every run to FILE (go tool pprof)")
	commands := flag.Bool("commands", false, "after every run, print Redis's time per key in each command (INFO commandstats), scripts' inner commands included")
	pin := flag.Bool("pin", true, "on a machine of two or more CPUs, run redis-server on CPU 0 and this process on the others, so that neither waits for the other's cores")
	flag.Parse()
	if *pin && runtime.NumCPU() > 1 && os.Getenv(pinnedEnv) == "" {
		if err := pinAndRestart(); err != nil {
			fmt.Fprintln(os.Stderr, "queue-bench: -pin:", err)
			os.Exit(1)
		}
	}
	var handlers []int
	for _, f := range strings.Split(*handlerList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bad -handlers %q\n", *handlerList)
			os.Exit(2)
		}
		handlers = append(handlers, n)
	}
	cfg := config{pinned: os.Getenv(pinnedEnv) != "", rounds: *rounds, keys: *keys, producers: *producers, handlers: handlers, asynqCheck: *asynqCheck, commands: *commands}
	for _, name := range strings.Split(*only, ",") {
		if !slices.Contains(systemNames, strings.TrimSpace(name)) {
			fmt.Fprintf(os.Stderr, "bad -systems %q: each must be one of %s\n", *only, strings.Join(systemNames, ", "))
			os.Exit(2)
		}
		cfg.systems = append(cfg.systems, strings.TrimSpace(name))
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "queue-bench:", err)
			os.Exit(1)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "queue-bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// systemNames are the -systems names, in the table's column order.
var systemNames = []string{"raw", "ours", "asynq"}

// config is what the flags ask for.
type config struct {
	// pinned: redis-server runs on CPU 0, this process on the others.
	pinned                  bool
	rounds, keys, producers int
	handlers                []int
	asynqCheck              time.Duration
	// systems are the names of the systems to run.
	systems []string
	// commands prints Redis's time per key by command after every run.
	commands bool
}

// system is one way of moving keys from producers to handlers.
type system struct {
	name string
	// start readies the consumers with n handlers, each calling handled once per key, on
	// clients made with newClient, and returns how to add a key and how to wait for the
	// consumers to stop once ctx ended.
	start func(ctx context.Context, n int, newClient func() *redis.Client, handled func()) (add func(ctx context.Context, key string) error, stop func(), err error)
}

// result is one run's figures.
type result struct {
	perSec   float64
	cpuPer1k float64 // Redis CPU, ms per 1,000 keys
	// goPer1k is this process's CPU (producers, consumers and their clients), ms per 1,000
	// keys: it shares the machine with Redis.
	goPer1k   float64
	wallClock time.Duration
	// Per key: round trips the system's clients made (a pipeline is one), scripts Redis ran,
	// and commands Redis ran (those of scripts included, the script calls not).
	trips, scripts, commands float64
}

func run(cfg config) error {
	rounds, keys, producers, handlers := cfg.rounds, cfg.keys, cfg.producers, cfg.handlers
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Stop()
	if cfg.pinned {
		if err := unix.SchedSetaffinity(srv.Pid(), cpuSet(0, 1)); err != nil {
			return fmt.Errorf("pin redis-server to CPU 0: %w", err)
		}
	}
	// An interrupted run stops its redis-server too, which would otherwise outlive it.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-stop
		srv.Stop()
		os.Exit(130)
	}()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	ctx := context.Background()
	version, _ := admin.InfoMap(ctx, "server").Result()
	systems := []system{rawStreams(), ourQueue(), asynqSystem(cfg.asynqCheck)}

	// results[h][s] holds every round's figures of system s at handler count h.
	results := make([][][]result, len(handlers))
	for h := range handlers {
		results[h] = make([][]result, len(systems))
	}
	started := time.Now()
	load0 := loadAverage()
	for round := range rounds {
		for h, n := range handlers {
			for s, sys := range systems {
				if !slices.Contains(cfg.systems, systemNames[s]) {
					continue
				}
				r, err := measure(ctx, admin, srv.Addr, sys, n, keys, producers, cfg.commands)
				if err != nil {
					return fmt.Errorf("%s, %d handlers, round %d: %w", sys.name, n, round+1, err)
				}
				results[h][s] = append(results[h][s], r)
				fmt.Fprintf(os.Stderr, "round %d/%d  %-12s %2d handlers  %8.0f keys/s  per 1,000 keys: %6.1f ms Redis CPU, %6.1f ms client CPU  per key: %.2f round trips, %.2f scripts, %.1f commands  (%s)\n",
					round+1, rounds, sys.name, n, r.perSec, r.cpuPer1k, r.goPer1k, r.trips, r.scripts, r.commands, r.wallClock.Round(time.Millisecond))
			}
		}
	}

	redisVersion := ""
	if v, ok := version["Server"]["redis_version"]; ok {
		redisVersion = "Redis " + v
	}
	placement, cores := "redis-server and this process sharing every core", runtime.NumCPU()
	if cfg.pinned {
		cores, _ = strconv.Atoi(os.Getenv(pinnedEnv))
		placement = "redis-server on CPU 0, this process on the others"
	}
	fmt.Printf("\n%s distinct keys per run added by %d producers, no-op handlers; median of %d interleaved rounds "+
		"(raw, ours, asynq at each handler count in turn) on one redis-server on loopback (%s); %d cores, %s; %s, GOMAXPROCS %d; "+
		"load average %s at the start, %s at the end; %s in all.\n\n",
		thousands(float64(keys)), producers, rounds, redisVersion, cores, runtime.Version(), placement, runtime.GOMAXPROCS(0),
		load0, loadAverage(), time.Since(started).Round(time.Second))
	fmt.Println("| handlers | figure | raw streams | our queue | asynq v0.26.0 | ours ÷ raw | ours ÷ asynq |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- |")
	for h, n := range handlers {
		for _, f := range []struct {
			name   string
			value  func(result) float64
			format func(float64) string
		}{
			{"keys/s", func(r result) float64 { return r.perSec }, thousands},
			{"Redis CPU per 1,000 keys", func(r result) float64 { return r.cpuPer1k }, func(v float64) string { return fmt.Sprintf("%.1f ms", v) }},
			{"client CPU per 1,000 keys (producers and consumers)", func(r result) float64 { return r.goPer1k }, func(v float64) string { return fmt.Sprintf("%.1f ms", v) }},
			{"round trips per key", func(r result) float64 { return r.trips }, func(v float64) string { return fmt.Sprintf("%.2f", v) }},
			{"scripts per key", func(r result) float64 { return r.scripts }, func(v float64) string { return fmt.Sprintf("%.2f", v) }},
			{"commands per key (in scripts too)", func(r result) float64 { return r.commands }, func(v float64) string { return fmt.Sprintf("%.1f", v) }},
		} {
			var v [3]float64
			var cell [3]string
			for s := range systems {
				v[s], cell[s] = 0, "–"
				if len(results[h][s]) > 0 {
					v[s] = median(results[h][s], f.value)
					cell[s] = f.format(v[s])
				}
			}
			fmt.Printf("| %d | %s | %s | %s | %s | %s | %s |\n", n, f.name, cell[0], cell[1], cell[2],
				ratio(v[1], v[0]), ratio(v[1], v[2]))
		}
	}
	return nil
}

// measure runs one system once on an empty database: producers add the keys while the
// consumers handle them; the run lasts from the first add to the last key handled.
func measure(ctx context.Context, admin *redis.Client, addr string, sys system, handlers, keys, producers int, byCommand bool) (result, error) {
	if err := admin.FlushAll(ctx).Err(); err != nil {
		return result{}, err
	}
	var handled, trips atomic.Int64
	var counting atomic.Bool
	newClient := func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr})
		c.AddHook(tripCounter{counting: &counting, n: &trips})
		return c
	}
	all := make(chan struct{})
	runCtx, cancel := context.WithCancel(ctx)
	add, wait, err := sys.start(runCtx, handlers, newClient, func() {
		if handled.Add(1) == int64(keys) {
			close(all)
		}
	})
	if err != nil {
		cancel()
		return result{}, err
	}
	// The consumers are gone before the next run's FLUSHALL.
	stop := func() { cancel(); wait() }
	cpu0, err := redisproc.CPU(ctx, admin)
	if err == nil {
		err = admin.ConfigResetStat(ctx).Err()
	}
	if err != nil {
		stop()
		return result{}, err
	}
	counting.Store(true)
	go0 := processCPU()
	began := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for range producers {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(keys); i = next.Add(1) - 1 {
				if err := add(runCtx, "k"+strconv.FormatInt(i, 10)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		stop()
		return result{}, fmt.Errorf("add: %w", err)
	}
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		stop()
		return result{}, fmt.Errorf("%d of %d keys handled after 5 minutes", handled.Load(), keys)
	}
	elapsed := time.Since(began)
	go1 := processCPU()
	cpu1, err := redisproc.CPU(ctx, admin)
	n := trips.Load()
	var scripts, commands int64
	if err == nil {
		scripts, commands, err = commandCalls(ctx, admin, byCommand, keys)
	}
	stop()
	if err != nil {
		return result{}, err
	}
	k := float64(keys)
	return result{
		perSec:    k / elapsed.Seconds(),
		cpuPer1k:  (cpu1 - cpu0).Seconds() * 1000 / k * 1000,
		goPer1k:   (go1 - go0).Seconds() * 1000 / k * 1000,
		wallClock: elapsed,
		trips:     float64(n) / k, scripts: float64(scripts) / k, commands: float64(commands) / k,
	}, nil
}

// processCPU is this process's CPU time so far, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tripCounter counts a client's round trips once counting is set: every command or pipeline
// sent.
type tripCounter struct {
	counting *atomic.Bool
	n        *atomic.Int64
}

func (t tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (t tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if t.counting.Load() {
			t.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (t tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if t.counting.Load() {
			t.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// commandCalls reads INFO commandstats since the last CONFIG RESETSTAT: how many scripts
// Redis ran (EVALSHA and EVAL), and how many commands (those run by scripts included, the
// script calls and the INFO itself not). With print it also prints, per key, each command's
// calls and microseconds, the most costly first (a script's time includes its commands').
func commandCalls(ctx context.Context, admin *redis.Client, print bool, keys int) (scripts, commands int64, err error) {
	info, err := admin.InfoMap(ctx, "commandstats").Result()
	if err != nil {
		return 0, 0, err
	}
	type cost struct {
		name        string
		calls, usec int64
	}
	var costs []cost
	for name, stats := range info["Commandstats"] {
		var calls, usec int64
		for _, f := range strings.Split(stats, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				calls, _ = strconv.ParseInt(v, 10, 64)
			}
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		costs = append(costs, cost{strings.TrimPrefix(name, "cmdstat_"), calls, usec})
		switch strings.TrimPrefix(name, "cmdstat_") {
		case "evalsha", "eval":
			scripts += calls
		case "info", "config|resetstat":
		default:
			commands += calls
		}
	}
	if print {
		slices.SortFunc(costs, func(a, b cost) int { return int(b.usec - a.usec) })
		for _, c := range costs {
			fmt.Fprintf(os.Stderr, "    %-22s %6.2f calls/key %7.2f µs/key %6.2f µs/call\n", c.name,
				float64(c.calls)/float64(keys), float64(c.usec)/float64(keys), float64(c.usec)/float64(max(c.calls, 1)))
		}
	}
	return scripts, commands, nil
}

// pinnedEnv marks the process pinAndRestart started, with the machine's number of CPUs (its
// own runtime.NumCPU counts only those it may run on).
const pinnedEnv = "QUEUE_BENCH_PINNED"

// pinAndRestart runs this program again on every CPU but the first, which redis-server gets
// (run): the two share no core, as in production, where Redis has cores of its own. Sharing
// them, each waits for the other's turn, and a system's figures would measure how much CPU its
// client burns beside Redis rather than the Redis work it asks for. A thread's affinity
// passes to what it executes, and so to every thread of the new process.
func pinAndRestart() error {
	runtime.LockOSThread()
	if err := unix.SchedSetaffinity(0, cpuSet(1, runtime.NumCPU())); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return syscall.Exec(self, os.Args, append(os.Environ(), pinnedEnv+"="+strconv.Itoa(runtime.NumCPU())))
}

// cpuSet is the set of CPUs from first up to, not including, end.
func cpuSet(first, end int) *unix.CPUSet {
	var set unix.CPUSet
	for cpu := first; cpu < end; cpu++ {
		set.Set(cpu)
	}
	return &set
}

// ratio formats a÷b.
func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// streams is how many streams the raw system spreads its keys over: as many as the queue's
// shards.
const streams = 16

// rawStreams is the limit: XADD to 16 streams, one blocking XREADGROUP over all of them for
// as many messages as there are handlers (as the queue's consumer reads), an XACK per
// message; no coalescing, leases, fencing, retries or dead letters.
func rawStreams() system {
	return system{name: "raw streams", start: func(ctx context.Context, n int, newClient func() *redis.Client, handled func()) (func(context.Context, string) error, func(), error) {
		producer, consumer := newClient(), newClient()
		names := make([]string, 0, 2*streams)
		for s := range streams {
			name := "raw:" + strconv.Itoa(s)
			if err := consumer.XGroupCreateMkStream(ctx, name, "g", "0").Err(); err != nil {
				producer.Close()
				consumer.Close()
				return nil, nil, err
			}
			names = append(names, name)
		}
		for range streams {
			names = append(names, ">")
		}
		var wg sync.WaitGroup
		type msg struct {
			stream string
			id     string
		}
		jobs := make(chan msg, n)
		for range n {
			wg.Go(func() {
				for m := range jobs {
					if err := consumer.XAck(context.WithoutCancel(ctx), m.stream, "g", m.id).Err(); err != nil {
						fmt.Fprintln(os.Stderr, "raw XACK:", err)
						continue
					}
					handled()
				}
			})
		}
		var reader sync.WaitGroup
		reader.Go(func() {
			defer close(jobs)
			for ctx.Err() == nil {
				res, err := consumer.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "raw", Streams: names,
					Count: int64(n), Block: time.Second}).Result()
				if err != nil {
					continue
				}
				for _, s := range res {
					for _, m := range s.Messages {
						jobs <- msg{s.Stream, m.ID}
					}
				}
			}
		})
		var seq atomic.Int64
		add := func(ctx context.Context, key string) error {
			s := seq.Add(1) % streams
			return producer.XAdd(ctx, &redis.XAddArgs{Stream: "raw:" + strconv.FormatInt(s, 10), Values: []any{"k", key}}).Err()
		}
		stop := func() {
			reader.Wait()
			wg.Wait()
			producer.Close()
			consumer.Close()
		}
		return add, stop, nil
	}}
}

// ourQueue is package queue with its defaults (16 shards, 30 s lease, 1 s blocking read), one
// consumer of n handlers.
func ourQueue() system {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	return system{name: "our queue", start: func(ctx context.Context, n int, newClient func() *redis.Client, handled func()) (func(context.Context, string) error, func(), error) {
		producer, consumer := newClient(), newClient()
		pq, err := queue.New(producer, queue.Options{})
		if err != nil {
			return nil, nil, err
		}
		if err := pq.Setup(ctx); err != nil {
			return nil, nil, err
		}
		cq, err := queue.New(consumer, queue.Options{})
		if err != nil {
			return nil, nil, err
		}
		c, err := cq.NewConsumer(queue.HandlerFunc(func(context.Context, queue.Task) (time.Duration, error) {
			handled()
			return 0, nil
		}), queue.ConsumerOptions{Name: "bench", Concurrency: n, Logger: quiet})
		if err != nil {
			return nil, nil, err
		}
		var wg sync.WaitGroup
		wg.Go(func() { c.Start(ctx) })
		stop := func() {
			wg.Wait()
			producer.Close()
			consumer.Close()
		}
		return pq.Enqueue, stop, nil
	}}
}

// asynqSystem is asynq with n handlers on one queue; each key is a task whose ID is the key,
// so that a key already waiting is refused, as the queue coalesces it. Its idle handlers poll
// every checkInterval (asynq has no blocking read).
func asynqSystem(checkInterval time.Duration) system {
	return system{name: "asynq", start: func(ctx context.Context, n int, newClient func() *redis.Client, handled func()) (func(context.Context, string) error, func(), error) {
		producer, consumer := newClient(), newClient()
		client := asynq.NewClientFromRedisClient(producer)
		srv := asynq.NewServerFromRedisClient(consumer, asynq.Config{
			Concurrency: n, Queues: map[string]int{"default": 1}, TaskCheckInterval: checkInterval,
			LogLevel: asynq.ErrorLevel,
		})
		if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
			handled()
			return nil
		})); err != nil {
			return nil, nil, err
		}
		add := func(ctx context.Context, key string) error {
			_, err := client.EnqueueContext(ctx, asynq.NewTask("key", nil), asynq.TaskID(key))
			if errors.Is(err, asynq.ErrTaskIDConflict) {
				return nil
			}
			return err
		}
		stop := func() {
			srv.Shutdown()
			client.Close()
			producer.Close()
			consumer.Close()
		}
		return add, stop, nil
	}}
}

func median(rs []result, f func(result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// thousands formats a rate as 12,345.
func thousands(f float64) string {
	s := strconv.FormatInt(int64(f+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// loadAverage is the machine's 1-minute load average, or "?" where /proc does not say.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
