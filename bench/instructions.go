package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/redisproc"
)

// Instructions is what --instructions counts: the instructions one request cost each process
// under valgrind's callgrind, which, unlike CPU time, come out the same from run to run
// whatever else the machine does (within a fraction of a percent: Go's scheduling varies). On
// a shared machine whose CPU times move by a third between runs, a change of a few percent
// shows only so.
type Instructions struct {
	Requests int
	// API and Redis per createInstance; Bare per `{ ping }` of the bare gqlgen handler.
	API, Redis, Bare uint64
}

// instructionClients is how many clients send the counted requests: enough that creates share
// round trips to Redis, as under load; few, as every process runs some fifty times slower.
const instructionClients = 16

// countInstructions starts redis-server, the API and the bare handler under callgrind, sends
// n creates and n pings after as many to warm each, and counts what the counted ones cost.
func countInstructions(ctx context.Context, cfg Config, n int) (Instructions, error) {
	got := Instructions{Requests: n}
	for _, tool := range []string{"valgrind", "callgrind_control"} {
		if _, err := exec.LookPath(tool); err != nil {
			return got, fmt.Errorf("--instructions runs the processes under valgrind (apt-get install valgrind): %w", err)
		}
	}
	s := &system{cfg: cfg, embedded: true, secret: string(auth.RandomSecret())}
	var err error
	if s.exe, err = cfg.binary(); err != nil {
		return got, err
	}
	if s.dir, err = os.MkdirTemp("", "computeql-instructions-"); err != nil {
		return got, fmt.Errorf("run directory: %w", err)
	}
	defer os.RemoveAll(s.dir)
	// Go's preemption signals trip callgrind's signal handling: the goroutines yield instead.
	// And Go reads the CPU's clock with RDTSCP where the CPU has it, which valgrind 3.19 does
	// not know (the process dies of SIGILL at its first cputicks): LFENCE and RDTSC instead.
	grind := func(name string) []string {
		return []string{"valgrind", "--tool=callgrind", "--callgrind-out-file=" + filepath.Join(s.dir, name+".%p")}
	}
	env := []string{"GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off"}
	if s.redis, err = redisproc.StartUnder(grind("redis")); err != nil {
		return got, err
	}
	defer s.redis.Stop()
	s.redisURL = "redis://" + s.redis.Addr + "/0"
	if err := s.writeCatalog(); err != nil {
		return got, err
	}
	if s.keys, err = auth.New(auth.Config{Secret: []byte(s.secret)}); err != nil {
		return got, fmt.Errorf("tokens: %w", err)
	}
	token, err := s.token()
	if err != nil {
		return got, err
	}

	apiArgs := append(grind("api"), s.exe)
	apiArgs = append(apiArgs, s.roleArgs("api")...)
	api, err := startChild(ctx, apiArgs[0], "api", s.dir, append(apiArgs[1:], "--listen", "127.0.0.1:0"), append(env, s.roleEnv()...), servingAPI)
	if err != nil {
		return got, err
	}
	gql := newClient("http://"+api.addrs[servingAPI]+"/graphql", token, instructionClients)
	defer gql.close()
	if err := gql.unlimitedQuota(ctx, cfg.Org); err != nil {
		api.kill()
		return got, err
	}
	w := cfg.where()
	create := func(kind string) request {
		return func(ctx context.Context, i int) error {
			_, err := gql.create(ctx, w, "i-"+kind+"-"+strconv.Itoa(i))
			return err
		}
	}
	counts, err := countRequests(ctx, s.dir, n, create("warm"), create("c"), map[string]int{"api": api.cmd.Process.Pid, "redis": s.redis.Pid()})
	got.API, got.Redis = counts["api"], counts["redis"]
	api.kill()
	if err != nil {
		return got, err
	}

	bareArgs := append(grind("bare"), s.exe, "bench", "--serve-bare-graphql")
	bare, err := startChild(ctx, bareArgs[0], "bare-graphql", s.dir, bareArgs[1:], env, servingAPI)
	if err != nil {
		return got, err
	}
	plain := newClient("http://"+bare.addrs[servingAPI]+"/graphql", "", instructionClients)
	defer plain.close()
	ping := func(ctx context.Context, _ int) error { return plain.post(ctx, "{ ping }", nil, nil) }
	counts, err = countRequests(ctx, s.dir, n, ping, ping, map[string]int{"bare": bare.cmd.Process.Pid})
	got.Bare = counts["bare"]
	bare.kill()
	return got, err
}

// countRequests sends n requests of warm, zeroes the processes' counts, sends n of counted,
// has callgrind write what they cost, and returns it per request, by process name (pids, the
// processes' ids by name; each writes to its name.PID in dir).
func countRequests(ctx context.Context, dir string, n int, warm, counted request, pids map[string]int) (map[string]uint64, error) {
	if l := closedLoop(ctx, instructionClients, n, 0, warm); l.Errors > 0 {
		return nil, fmt.Errorf("warming: %d of %d requests failed, the first: %s", l.Errors, l.Requests, l.FirstError)
	}
	control := func(op string) error {
		for name, pid := range pids {
			if out, err := exec.CommandContext(ctx, "callgrind_control", op, strconv.Itoa(pid)).CombinedOutput(); err != nil {
				return fmt.Errorf("callgrind_control %s %s: %w: %s", op, name, err, out)
			}
		}
		return nil
	}
	if err := control("--zero"); err != nil {
		return nil, err
	}
	if l := closedLoop(ctx, instructionClients, n, 0, counted); l.Errors > 0 {
		return nil, fmt.Errorf("%d of %d requests failed, the first: %s", l.Errors, l.Requests, l.FirstError)
	}
	if err := control("--dump"); err != nil {
		return nil, err
	}
	per := map[string]uint64{}
	for name, pid := range pids {
		// The first dump since the start: what the counted requests cost.
		total, err := callgrindTotal(filepath.Join(dir, name+"."+strconv.Itoa(pid)+".1"))
		if err != nil {
			return nil, err
		}
		per[name] = total / uint64(n)
	}
	return per, nil
}

// callgrindTotal reads the instructions a callgrind dump counted: its summary line.
func callgrindTotal(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("callgrind dump: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "summary: "); ok {
			n, err := strconv.ParseUint(strings.Fields(v)[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("callgrind dump %s: summary %q: %w", path, v, err)
			}
			return n, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("callgrind dump %s: %w", path, err)
	}
	return 0, fmt.Errorf("callgrind dump %s has no summary line", path)
}

// writeInstructions prints what countInstructions counted.
func writeInstructions(out io.Writer, in Instructions) error {
	create := in.API + in.Redis
	_, err := fmt.Fprintf(out, `instructions per request (valgrind --tool=callgrind, %d requests of %d clients after as many to warm):
  createInstance            API %s + Redis %s = %s
  bare gqlgen { ping }      %s
  create ÷ bare             %.1f×
`, in.Requests, instructionClients, count(float64(in.API)), count(float64(in.Redis)), count(float64(create)),
		count(float64(in.Bare)), float64(create)/float64(max(in.Bare, 1)))
	return err
}
