package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"
)

// Config is one run's settings. Every field is a flag of `computeql bench`; sizes default to
// a run of under three minutes on a 2-core machine.
type Config struct {
	// Target is the base URL of a running system's API; empty starts an embedded one.
	Target string
	// RedisURL is the target's Redis (required with Target; the embedded system starts its own).
	RedisURL string
	// TokenSecret is the HS256 secret the target's API verifies tokens with (required with
	// Target; the embedded system makes one up when empty).
	TokenSecret string
	// CatalogFile is the catalogue the system runs with. Defaults to the benchmark's own,
	// which --print-catalog writes out for a target to be started with.
	CatalogFile  string
	PrintCatalog bool
	// Where instances are created; default to the ids of the benchmark's catalogue.
	Org, Project, Network, Flavor, Image string

	// Workers is the number of worker processes of the embedded system. Defaults to 2.
	Workers int
	// Duration is the length of each timed load: both create runs, both bare GraphQL runs,
	// the propagation run and the fan-out run. Defaults to 5s.
	Duration time.Duration
	// Concurrency is the number of clients of the closed-loop runs (create, the bare
	// handler, the Redis commands). Defaults to 64.
	Concurrency int
	// Rounds is how many pairs of closed-loop runs of the bare handler and of the create are
	// made, the two runs of a pair back to back (the create second, then first, in turn): the
	// figures that compare the two come from the pair whose create throughput is the median
	// share of its bare run's. Defaults to 3.
	Rounds int
	// CreateRate is the offered rate of the fixed-rate create run, per second. Defaults to 1,000.
	CreateRate float64
	// Instances is how many instances the convergence run creates; the propagation and
	// fan-out runs change their servers. Defaults to 2,000.
	Instances int
	// ChurnRate is the background server changes per second during the propagation run.
	// Defaults to 200.
	ChurnRate float64
	// Probes is the number of instances whose changes the propagation run times, each
	// watched by one subscriber; ProbeRate is their changes per second. Default to 100 and 50.
	Probes    int
	ProbeRate float64
	// Subscribers is the number of WebSocket subscribers of the fan-out run, ten per instance.
	// Defaults to 10,000.
	Subscribers int
	// FanOutRate is the server changes per second during the fan-out run. Defaults to 200.
	FanOutRate float64
	// RedisOps is the number of XADDs, and of XREADGROUPs, of the Redis limits; Pings that of
	// PINGs. Default to 20,000 and 2,000.
	RedisOps int
	Pings    int
	// Timeout bounds each wait for the system to catch up (convergence, deliveries after a
	// run). Defaults to 1m.
	Timeout time.Duration
	// Out is the directory of the report files latest.json and latest.md. Defaults to
	// bench-results, which git ignores: the committed report in docs/bench changes only when
	// asked (make bench-publish, or --out docs/bench).
	Out string
	// Profile, when set, is a directory the CPU and memory profiles of the API process
	// during the create (a closed-loop run after the rounds, which no figure reports) and
	// fan-out runs, and of the first worker during convergence, are written to (embedded only).
	Profile string
	// Instructions, when above 0, makes the run count the instructions of that many creates
	// in the API and Redis, and of as many requests to the bare handler, under valgrind's
	// callgrind, instead of timing anything (embedded only).
	Instructions int
	// ServeBare makes this process the bare GraphQL server of the limits, which the
	// benchmark starts as a process of its own, instead of a benchmark.
	ServeBare bool

	// exe is the binary whose roles the embedded system runs; empty means this one. Tests
	// set it to a computeql they built.
	exe string
}

// binary is the binary whose processes a run starts: Config.exe, or this one.
func (c Config) binary() (string, error) {
	if c.exe != "" {
		return c.exe, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find this binary to run its processes: %w", err)
	}
	return exe, nil
}

// where names the catalogue entries the run's instances are created with.
func (c Config) where() where {
	return where{Org: c.Org, Project: c.Project, Network: c.Network, Flavor: c.Flavor, Image: c.Image}
}

// subscribersPerInstance is how many fan-out subscribers watch each instance, as in the
// fan-out benchmarks of the feed and server packages.
const subscribersPerInstance = 10

// parseConfig reads the flags, after the COMPUTEQL_<FLAG> environment variables (looked up
// with env) that set their defaults, as every role of computeql does.
func parseConfig(args []string, env func(string) (string, bool), usage io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("computeql bench", flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.StringVar(&c.Target, "target", "", "base URL of a running system's API, e.g. http://127.0.0.1:8080 (none: start one with a real redis-server)")
	fs.StringVar(&c.RedisURL, "redis", "", "the target's Redis URL (with --target)")
	fs.StringVar(&c.TokenSecret, "token-secret", "", "HS256 secret the target verifies tokens with (with --target; none: a random one)")
	fs.StringVar(&c.CatalogFile, "catalog", "", "catalogue file the system runs with (none: the benchmark's, see --print-catalog)")
	fs.BoolVar(&c.PrintCatalog, "print-catalog", false, "print the benchmark's catalogue, to start a target with, and exit")
	fs.StringVar(&c.Org, "org", "bench", "organization instances are created in")
	fs.StringVar(&c.Project, "project", "load", "project instances are created in")
	fs.StringVar(&c.Network, "network", "bench-net", "network instances are created on (its prefix must hold --instances servers)")
	fs.StringVar(&c.Flavor, "flavor", "bench-small", "flavor of the instances")
	fs.StringVar(&c.Image, "image", "bench-image", "image of the instances")
	fs.IntVar(&c.Workers, "workers", 2, "worker processes of the embedded system")
	fs.DurationVar(&c.Duration, "duration", 5*time.Second, "length of each timed load")
	fs.IntVar(&c.Concurrency, "concurrency", 64, "clients of the closed-loop runs")
	fs.IntVar(&c.Rounds, "rounds", 3, "closed-loop runs of the bare handler and of the create, alternating; the comparison is the median round's")
	fs.Float64Var(&c.CreateRate, "create-rate", 1000, "creates per second of the fixed-rate run")
	fs.IntVar(&c.Instances, "instances", 2000, "instances the convergence run creates")
	fs.Float64Var(&c.ChurnRate, "churn-rate", 200, "background server changes per second while propagation is timed")
	fs.IntVar(&c.Probes, "probes", 100, "instances whose changes propagation times, each with one subscriber")
	fs.Float64Var(&c.ProbeRate, "probe-rate", 50, "timed server changes per second")
	fs.IntVar(&c.Subscribers, "subscribers", 10_000, "WebSocket subscribers of the fan-out run, ten per instance")
	fs.Float64Var(&c.FanOutRate, "fanout-rate", 200, "server changes per second of the fan-out run")
	fs.IntVar(&c.RedisOps, "redis-ops", 20_000, "XADDs and XREADGROUPs of the Redis limits")
	fs.IntVar(&c.Pings, "pings", 2000, "PINGs of the Redis round trip")
	fs.DurationVar(&c.Timeout, "timeout", time.Minute, "longest wait for the system to catch up")
	fs.StringVar(&c.Out, "out", "bench-results", "directory of the report files latest.json and latest.md (docs/bench: the committed report)")
	fs.StringVar(&c.Profile, "profile", "", "directory for CPU and memory profiles of the API (create, fan-out) and a worker (convergence) (embedded only)")
	fs.IntVar(&c.Instructions, "instructions", 0, "count the instructions of this many creates in the API and Redis, and of as many requests to the bare handler, under valgrind's callgrind, instead of timing (slow; 0: time as usual)")
	fs.BoolVar(&c.ServeBare, "serve-bare-graphql", false, "internal: serve the bare gqlgen handler of the limits on a free loopback port until stopped")
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := "COMPUTEQL_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := env(name); ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return c, c.validate()
}

// validate reports every setting that cannot make a run, at once.
func (c Config) validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	if c.Target != "" {
		u, err := url.Parse(c.Target)
		check(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "", "--target %q: want an http or https URL", c.Target)
		check(c.RedisURL != "", "--target needs --redis: the benchmark changes the region and reads the event log there")
		check(c.TokenSecret != "", "--target needs --token-secret: the benchmark mints its tokens")
		check(c.Profile == "", "--profile needs the embedded system: it reads the profiler of the API process it starts")
		check(c.Instructions == 0, "--instructions needs the embedded system: it runs the processes it counts under valgrind")
	} else {
		check(c.RedisURL == "", "--redis (or COMPUTEQL_REDIS) is for --target; the embedded system starts its own redis-server")
	}
	check(c.Workers >= 1, "--workers must be at least 1")
	check(c.Duration > 0, "--duration must be positive")
	check(c.Concurrency >= 1, "--concurrency must be at least 1")
	check(c.Rounds >= 1, "--rounds must be at least 1")
	check(c.CreateRate > 0, "--create-rate must be positive")
	check(c.Instances >= 1, "--instances must be at least 1")
	check(c.ChurnRate >= 0, "--churn-rate must not be negative")
	check(c.Probes >= 1 && c.Probes <= c.Instances, "--probes must be between 1 and --instances")
	check(c.ProbeRate > 0, "--probe-rate must be positive")
	check(c.Subscribers >= subscribersPerInstance && c.Subscribers <= subscribersPerInstance*c.Instances,
		"--subscribers must be between %d and %d: ten watch each instance, of --instances", subscribersPerInstance, subscribersPerInstance*c.Instances)
	check(c.FanOutRate > 0, "--fanout-rate must be positive")
	check(c.RedisOps >= 1, "--redis-ops must be at least 1")
	check(c.Pings >= 1, "--pings must be at least 1")
	check(c.Instructions >= 0, "--instructions must not be negative")
	check(c.Timeout > 0, "--timeout must be positive")
	check(c.Out != "", "--out must name a directory")
	return errors.Join(errs...)
}
