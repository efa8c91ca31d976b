// Package app assembles computeql's processes: which roles a process runs, the region driver
// of each catalogue region, Redis, the queue, the workers and the HTTP servers. Command
// computeql only hands it the command line:
//
//	computeql [all]   everything in one process (embedded Redis unless --redis is given)
//	computeql api     the GraphQL API only (needs --redis)
//	computeql worker  reconcile instances, with the simulated region's clock (needs --redis)
//	computeql region  the simulated region's clock alone (needs --redis)
//	computeql token   mint a signed token
//	computeql catalog import --cloud NAME   print an OpenStack cloud's catalogue entries
//	computeql bench   measure the whole system against the machine's limits (see package bench)
//
// Every flag can also be set as an environment variable COMPUTEQL_<FLAG>, e.g. COMPUTEQL_REDIS.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	neturl "net/url"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/bench"
	"github.com/computeql/computeql/feed"
	"github.com/computeql/computeql/gcfloor"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
	"github.com/computeql/computeql/server"
	"github.com/computeql/computeql/store"
	"github.com/computeql/computeql/telemetry"
	"github.com/computeql/computeql/worker"
)

// config is what every role shares.
type config struct {
	listen      string
	redisURL    string
	catalog     string
	tokenSecret string
	buildDelay  time.Duration
	faults      string
	// How bearer tokens are verified; see auth.Config.
	jwksFile      string
	oidcIssuer    string
	tokenIssuer   string
	tokenAudience string
	tokenSkew     time.Duration
	// Requests per second and burst per principal on each API process.
	rateLimit float64
	rateBurst int
	// What stays open: sockets of the process and of one principal, subscriptions of one
	// socket and of one principal, consoles of the process and of one principal.
	maxSockets, maxPrincipalSockets, maxSocketSubscriptions, maxPrincipalSubscriptions int
	maxConsoles, maxPrincipalConsoles                                                  int
	// Where clients reach the API; empty: as each request reached it.
	publicURL string
	// Browser origins besides the API's own that may open a WebSocket, comma-separated.
	allowedOrigins string
	// Whether the API answers introspection queries.
	introspection bool
	// Address of Go's profiler; empty: not served.
	pprof string
	// Address of /metrics, /healthz and /readyz apart from the API; empty: not served.
	opsListen string
	// How logs are written: auto, json or text; and the least level written.
	logFormat string
	logLevel  slog.Level
	// OTLP/HTTP collector spans are sent to; empty: tracing off.
	otlpEndpoint string
	// The least growth of the Go heap between collections, in MiB; 0: GOGC alone decides.
	heapFloorMiB int
	// demoInstances: the all-in-one process on the embedded Redis and the demo catalogue
	// creates a few instances, so that the dashboard has something to show.
	demoInstances bool
}

// maxHeapFloorMiB bounds --heap-floor-mib at 1 TiB, far past any machine's memory and far
// below where the floor in bytes would overflow.
const maxHeapFloorMiB = 1 << 20

// flags defines the flags of the serving commands (all, api, worker, region). A flag's
// COMPUTEQL_<FLAG> environment variable, when set, replaces its default and is parsed like the
// flag itself, so a malformed value is an error rather than silently the default.
func flags(name string, c *config) (*flag.FlagSet, error) {
	fs := flag.NewFlagSet("computeql "+name, flag.ContinueOnError)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address to serve HTTP on")
	fs.StringVar(&c.redisURL, "redis", "", "Redis URL, e.g. redis://127.0.0.1:6379/0, or a Redis Cluster's as redis+cluster://host:port,host:port (any of its nodes; none: an embedded in-memory Redis)")
	fs.StringVar(&c.catalog, "catalog", "", "catalogue file (JSON; none: the built-in demo catalogue)")
	tokenFlags(fs, c, "HS256 secret for bearer tokens, at least 32 bytes (none, and no --jwks-file or --oidc-issuer: a random one, printed tokens only)")
	fs.StringVar(&c.jwksFile, "jwks-file", "", "JSON Web Key Set file whose RS256 and ES256 keys verify bearer tokens")
	fs.DurationVar(&c.tokenSkew, "token-skew", 30*time.Second, "clock difference allowed on the exp and nbf of bearer tokens, at most 5m")
	fs.Float64Var(&c.rateLimit, "rate-limit", 50, "requests per second one principal may sustain on each API process (negative: no limit)")
	fs.IntVar(&c.rateBurst, "rate-burst", 100, "requests one principal may send at once after a quiet spell")
	fs.IntVar(&c.maxSockets, "max-sockets", 10_000, "WebSockets one API process holds open; more are refused with 429")
	fs.IntVar(&c.maxPrincipalSockets, "max-sockets-per-principal", 32, "WebSockets one principal holds open on one API process; more are closed with 4429")
	fs.IntVar(&c.maxSocketSubscriptions, "max-subscriptions-per-socket", 100, "subscriptions running on one WebSocket; more are refused with RATE_LIMITED")
	fs.IntVar(&c.maxPrincipalSubscriptions, "max-subscriptions-per-principal", 200, "subscriptions one principal runs on one API process, over every transport; more are refused with RATE_LIMITED")
	fs.IntVar(&c.maxConsoles, "max-consoles", 32, "serial consoles attached through one API process; more are refused with 429")
	fs.IntVar(&c.maxPrincipalConsoles, "max-consoles-per-principal", 4, "serial consoles one principal has attached through one API process; more are refused with 429")
	fs.StringVar(&c.publicURL, "public-url", "", "where clients reach the API, e.g. https://api.example.com, for the URLs it hands out (console sessions); none: as each request reached it")
	fs.StringVar(&c.allowedOrigins, "allowed-origins", "", `browser origins besides the API's own that may open a WebSocket to /graphql, comma-separated, e.g. https://dash.example.com ("*": any; none: same-origin pages only)`)
	fs.StringVar(&c.logFormat, "log-format", "auto", "log format: json, text, or auto (JSON unless standard error is a terminal)")
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "least level logged: debug, info, warn or error")
	fs.StringVar(&c.opsListen, "ops-listen", "", "address to serve /metrics, /healthz and /readyz on, apart from the API: how worker and region processes are watched (none: off; the API serves them on --listen too)")
	fs.StringVar(&c.otlpEndpoint, "otlp-endpoint", "", "OpenTelemetry collector's OTLP/HTTP URL to send traces to, e.g. http://127.0.0.1:4318 (none: tracing off)")
	fs.StringVar(&c.pprof, "pprof", "", "address to serve Go's profiler (/debug/pprof/) on, apart from the API, e.g. 127.0.0.1:6060 (none: off); keep it private")
	fs.BoolVar(&c.introspection, "introspection", true, "answer GraphQL introspection queries (GraphiQL and code generators need them; false: refused with FORBIDDEN)")
	fs.DurationVar(&c.buildDelay, "build-delay", 2*time.Second, "how long the simulated region takes to build a server")
	fs.StringVar(&c.faults, "region-faults", "", `faults the simulated region injects, as JSON: {"errorRate": 0.3, "slowCalls": "200ms", "failBuildPrefix": "fail-", "duplicateCreates": true}`)
	fs.IntVar(&c.heapFloorMiB, "heap-floor-mib", 64, "least growth of the Go heap between garbage collections, in MiB, while what is live is smaller (0: GOGC alone decides)")
	fs.BoolVar(&c.demoInstances, "demo-instances", true, "with the embedded Redis and the demo catalogue, create a few demo instances at start (false: start empty)")
	return fs, fromEnv(fs)
}

// tokenFlags defines the flags that say how tokens are signed, which the serving commands and
// token share; secretUsage is what --token-secret means to the command.
func tokenFlags(fs *flag.FlagSet, c *config, secretUsage string) {
	fs.StringVar(&c.tokenSecret, "token-secret", "", secretUsage)
	fs.StringVar(&c.oidcIssuer, "oidc-issuer", "", "OpenID Connect issuer URL (https) whose published RS256 and ES256 keys verify bearer tokens")
	fs.StringVar(&c.tokenIssuer, "token-issuer", "", `iss claim of bearer tokens (none: the --oidc-issuer, else "computeql")`)
	fs.StringVar(&c.tokenAudience, "token-audience", "", `value the aud claim of bearer tokens must include (none: "computeql")`)
}

// fromEnv sets each defined flag from its COMPUTEQL_<FLAG> environment variable, when set.
func fromEnv(fs *flag.FlagSet) error {
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := "COMPUTEQL_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
	})
	return errors.Join(errs...)
}

// usage lists the commands; each command's -h lists its flags.
const usage = `computeql: a GraphQL API for cloud compute instances.

Usage: computeql [command] [flags]

Commands:
  all       (the default) the API, a worker and the regions' drivers in one process
  api       the GraphQL API, the dashboard and GraphiQL
  worker    a worker: reconciles instances against their regions
  region    the simulated region's clock alone (a process of its own)
  token     mint a bearer token signed with --token-secret
  catalog   catalog import --cloud NAME: an OpenStack cloud's flavors, images, networks and
            security groups as catalogue entries to complete
  bench     the load tool: the whole system against the machine's limits
  version   print the version and the source revision
  help      print this, or a command's flags: computeql help COMMAND

Every flag may be set by an environment variable instead: --listen as COMPUTEQL_LISTEN.
`

// Run runs the command line args (without the program name) until ctx ends. Asking for help
// (help, -h, --help) is not an error.
func Run(ctx context.Context, args []string, out io.Writer) error {
	err := run(ctx, args, out)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

func run(ctx context.Context, args []string, out io.Writer) error {
	role := "all"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		role, args = args[0], args[1:]
	}
	if role == "all" && len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		_, err := io.WriteString(out, usage)
		return err
	}
	switch role {
	case "all", "api", "worker", "region":
		return serve(ctx, role, args, out)
	case "token":
		return mintToken(args, out)
	case "catalog":
		return catalogCommand(ctx, args, out)
	case "bench":
		return bench.Main(ctx, args, out)
	case "version":
		_, err := fmt.Fprintln(out, version())
		return err
	case "help":
		if len(args) == 0 {
			_, err := io.WriteString(out, usage)
			return err
		}
		return run(ctx, []string{args[0], "-h"}, out)
	default:
		return fmt.Errorf("unknown command %q (want all, api, worker, region, token, catalog, bench, version or help)", role)
	}
}

// version is the module's version and the source revision it was built from, as the Go
// toolchain recorded them.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "computeql (no build information)"
	}
	v := "computeql " + info.Main.Version
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v += " revision " + s.Value
		case "vcs.modified":
			if s.Value == "true" {
				v += " (modified)"
			}
		}
	}
	return v + " " + info.GoVersion
}

func serve(ctx context.Context, role string, args []string, out io.Writer) error {
	var c config
	fs, err := flags(role, &c)
	if err != nil {
		return err
	}
	fs.SetOutput(out) // -h lists the flags where the caller reads
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLogger(os.Stderr, c.logFormat, c.logLevel)
	if err != nil {
		return err
	}
	if c.heapFloorMiB < 0 || c.heapFloorMiB > maxHeapFloorMiB {
		return fmt.Errorf("--heap-floor-mib must be from 0 to %d, got %d", maxHeapFloorMiB, c.heapFloorMiB)
	}
	// A serving process keeps little live and allocates fast: without a floor, collecting takes
	// a fifth of its CPU.
	defer gcfloor.Start(uint64(c.heapFloorMiB) << 20)()
	redis.SetLogger(redisLog{log})
	shutdownTracing, err := telemetry.Setup(ctx, telemetry.Config{Endpoint: c.otlpEndpoint, Role: role, Logger: log})
	if err != nil {
		return err
	}
	defer shutdownTracing(context.WithoutCancel(ctx))
	// One registry for every part of the process, served at /metrics.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if role != "all" && c.redisURL == "" {
		return fmt.Errorf("%s needs --redis: separate roles share nothing but Redis", role)
	}
	if c.pprof != "" {
		stopPprof, err := serveAside("--pprof", c.pprof, pprofHandler(), log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}
	cat := region.Demo()
	if c.catalog != "" {
		if cat, err = region.Load(c.catalog); err != nil {
			return err
		}
	}
	// With no way at all to verify tokens, a random secret: only the tokens this process
	// prints will verify, as before public keys could be configured.
	secret := []byte(c.tokenSecret)
	if len(secret) == 0 && c.jwksFile == "" && c.oidcIssuer == "" {
		secret = auth.RandomSecret()
	}
	keys, err := auth.New(auth.Config{
		Secret: secret, JWKSFile: c.jwksFile, OIDCIssuer: c.oidcIssuer,
		Issuer: c.tokenIssuer, Audience: c.tokenAudience, ClockSkew: c.tokenSkew,
	})
	if err != nil {
		return fmt.Errorf("bearer tokens: %w", err)
	}

	rdb, closeRedis, err := connect(c.redisURL)
	if err != nil {
		return err
	}
	rdb.AddHook(store.CallLimitHook{})
	defer closeRedis()
	q, err := queue.New(rdb, queue.Options{})
	if err != nil {
		return err
	}
	// A create's script enqueues its work too, where it can reach the queue's keys.
	st := store.New(rdb, store.WithQueue(q))
	if err := st.Load(ctx); err != nil {
		return err
	}
	orgs := make([]string, len(cat.Organizations))
	for i, o := range cat.Organizations {
		orgs[i] = o.ID
	}
	// Every process runs the upgrade before it serves or works: it costs one GET per
	// organization once done, and processes starting together share the work safely.
	upgraded, err := st.Upgrade(ctx, orgs)
	if err != nil {
		return err
	}
	if upgraded.Records > 0 {
		log.Info("upgraded stored records", "schema_version", store.SchemaVersion, "organizations", upgraded.Organizations, "records", upgraded.Records)
	}
	if err := q.Setup(ctx); err != nil {
		return err
	}
	faults, err := parseFaults(c.faults)
	if err != nil {
		return err
	}
	drivers, err := newRegionDrivers(cat, rdb, role, sim.Options{Catalog: cat, BuildDelay: c.buildDelay, Faults: faults, Logger: log}, log, reg)
	if err != nil {
		return err
	}
	// Workers and the API call the regions through one wrapper that times and traces each
	// call; the drivers' own background work runs unwrapped.
	rc, err := region.Instrument(drivers.router, telemetry.TracerProvider(), reg)
	if err != nil {
		return err
	}
	ready := readiness(ctx, rdb)
	if c.opsListen != "" {
		stopOps, err := serveAside("--ops-listen", c.opsListen, server.Ops(reg, ready, log), log)
		if err != nil {
			return err
		}
		defer stopOps()
	}
	var wk *worker.Worker
	if role == "all" || role == "worker" {
		wk, err = worker.New(worker.Options{
			Store: st, Region: rc, Queue: q, Logger: log, Registerer: reg,
			Organizations: func() []string { return orgs },
			NetworkExists: func(id string) bool { _, ok := cat.Network(id); return ok },
			Servers:       drivers.router.Servers,
		})
		if err != nil {
			return err
		}
	}
	var srv *http.Server
	var ln net.Listener
	if role == "all" || role == "api" {
		svc, err := instance.NewService(instance.Options{Catalog: cat, Store: st, Queue: q, Region: rc, Logger: log})
		if err != nil {
			return err
		}
		if srv, ln, err = apiServer(ctx, c, cat, svc, st, keys, ready, log, reg); err != nil {
			return err
		}
		if role == "all" && c.redisURL == "" && c.catalog == "" && c.demoInstances {
			seedDemo(ctx, svc, cat, log)
		}
		if role == "all" {
			if err := printWelcome(out, keys, cat, ln.Addr().String(), c.redisURL == ""); err != nil {
				return err
			}
		}
		log.Info("serving", "role", role, "addr", ln.Addr().String())
	}

	// Shutdown order: the HTTP server stops accepting and finishes in-flight requests; the
	// worker finishes in-flight reconciles within its deadline; the drivers' clocks and
	// connections stop; Redis is closed last (deferred above), as everything before may still
	// use it.
	var wg sync.WaitGroup
	errc := make(chan error, 2+len(drivers.runs))
	if srv != nil {
		wg.Go(func() {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		})
		wg.Go(func() {
			<-ctx.Done()
			shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := srv.Shutdown(shutdownCtx); err != nil {
				errc <- fmt.Errorf("shutdown: %w", err)
			}
		})
	}
	if wk != nil {
		wg.Go(func() { errc <- wk.Start(ctx) })
	}
	for _, run := range drivers.runs {
		wg.Go(func() { errc <- run(ctx) })
	}
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	log.Info("stopped", "role", role)
	return errors.Join(errs...)
}

// readiness answers /readyz. A process is not ready once it has begun to shut down (its
// event readers, queue consumers and region watcher stop with it), nor while Redis does not
// answer. Scripts need no check: every call falls back from EVALSHA to EVAL, so a Redis that
// forgot them serves as before.
func readiness(process context.Context, rdb redis.UniversalClient) func(context.Context) error {
	return func(ctx context.Context) error {
		if process.Err() != nil {
			return errors.New("shutting down")
		}
		if err := rdb.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis: %w", err)
		}
		return nil
	}
}

// apiServer builds the HTTP server of the API role and its listener.
func apiServer(ctx context.Context, c config, cat *region.Catalog, svc *instance.Service, st *store.Store, keys *auth.Keys, ready func(context.Context) error, log *slog.Logger, reg *prometheus.Registry) (*http.Server, net.Listener, error) {
	events := feed.New(ctx, st, feed.Options{Logger: log})
	if err := events.Register(reg); err != nil {
		return nil, nil, err
	}
	h, err := server.New(server.Options{
		Service: svc, Feed: events, Keys: keys, Logger: log, Registry: reg, RateLimit: c.rateLimit, RateBurst: c.rateBurst,
		Context:    ctx,
		MaxSockets: c.maxSockets, MaxSocketsPerPrincipal: c.maxPrincipalSockets,
		MaxSubscriptionsPerSocket: c.maxSocketSubscriptions, MaxSubscriptionsPerPrincipal: c.maxPrincipalSubscriptions,
		MaxConsoles: c.maxConsoles, MaxConsolesPerPrincipal: c.maxPrincipalConsoles, PublicURL: c.publicURL,
		DisableIntrospection: !c.introspection, AllowedOrigins: origins(c.allowedOrigins),
		Ready: ready,
	})
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", c.listen)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, nil, fmt.Errorf("%w: another program serves %s; stop it, or listen elsewhere with --listen 127.0.0.1:8081 (or COMPUTEQL_LISTEN=127.0.0.1:8081 make run)", err, c.listen)
	}
	if err != nil {
		return nil, nil, err
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}, ln, nil
}

// origins splits the --allowed-origins list; server.New refuses an entry that is not an origin.
func origins(list string) []string {
	var out []string
	for o := range strings.SplitSeq(list, ",") {
		if o = strings.TrimSpace(o); o != "" {
			out = append(out, o)
		}
	}
	return out
}

// pprofHandler serves Go's profiler. It is served on a listener of its own, never the API's,
// so that it is reachable only where the operator chose. `computeql bench --profile` reads it.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // and the named profiles: heap, allocs, goroutine…
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// serveAside serves h on addr, a listener apart from the API's, until the returned stop.
func serveAside(flagName, addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	log.Info("serving", "flag", flagName, "addr", ln.Addr().String())
	return func() { srv.Close(); <-done }, nil
}

// redisLog puts go-redis's own messages (failed dials while Redis is away, for instance)
// into the process's structured log instead of plain lines on standard error.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "redis client", "detail", fmt.Sprintf(format, v...))
}

// newLogger writes structured records to w: JSON for machines, text for a person at a
// terminal; auto picks by whether w is a terminal.
func newLogger(w *os.File, format string, level slog.Level) (*slog.Logger, error) {
	if format == "auto" {
		format = "json"
		if st, err := w.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			format = "text"
		}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want auto, json or text", format)
}

// parseFaults reads --region-faults; durations are written as Go durations ("200ms").
func parseFaults(s string) (sim.Faults, error) {
	if s == "" {
		return sim.Faults{}, nil
	}
	var f struct {
		ErrorRate        float64 `json:"errorRate"`
		SlowCalls        string  `json:"slowCalls"`
		FailBuildPrefix  string  `json:"failBuildPrefix"`
		DuplicateCreates bool    `json:"duplicateCreates"`
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return sim.Faults{}, fmt.Errorf("--region-faults: %w", err)
	}
	// Decode stops after one value: without this check a botched edit such as
	// `{"errorRate": 0.1}, "slowCalls": "1s"}` would silently lose what follows the brace.
	if _, err := dec.Token(); err != io.EOF {
		return sim.Faults{}, errors.New("--region-faults: unexpected data after the JSON object")
	}
	out := sim.Faults{ErrorRate: f.ErrorRate, FailBuildPrefix: f.FailBuildPrefix, DuplicateCreates: f.DuplicateCreates}
	if f.SlowCalls != "" {
		d, err := time.ParseDuration(f.SlowCalls)
		if err != nil {
			return sim.Faults{}, fmt.Errorf("--region-faults: slowCalls: %w", err)
		}
		out.SlowCalls = d
	}
	return out, nil
}

// connect returns a client of the Redis at url, or of an embedded in-memory Redis when url is
// empty. Both are reached over the same client, so the code paths are the same. A
// redis+cluster:// (or rediss+cluster://) URL names a Redis Cluster by one or more of its
// nodes, comma-separated; the client discovers the rest and routes each command to the node
// holding its keys' slot.
func connect(url string) (redis.UniversalClient, func(), error) {
	if url == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, nil, fmt.Errorf("start embedded redis: %w", err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		return rdb, func() { rdb.Close(); mr.Close() }, nil
	}
	if scheme, _, _ := strings.Cut(url, "://"); strings.HasSuffix(scheme, "+cluster") {
		opts, err := parseClusterURL(url)
		if err != nil {
			return nil, nil, fmt.Errorf("--redis: %w", err)
		}
		if opts.PoolSize == 0 {
			opts.PoolSize = clusterPoolSize()
		}
		rdb := redis.NewClusterClient(opts)
		return rdb, func() { rdb.Close() }, nil
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, nil, fmt.Errorf("--redis: %w", err)
	}
	rdb := redis.NewClient(opts)
	return rdb, func() { rdb.Close() }, nil
}

// clusterBlockingReads is how many connections to one node a process may keep in blocking
// reads: a worker waits on each of the queue's 16 shards with a read of its own on a cluster
// (cross-slot reads are refused), a small cluster can hold all of them on one node, and the
// region's event watch is one more.
const clusterBlockingReads = 17

// clusterPoolSize is the connections per node of a cluster client whose URL sets no
// pool_size: what a client of a standalone Redis has (10 per CPU) plus the blocking reads.
// go-redis's own default, 5 per CPU per node, lets the blocking reads take every connection
// of a node, and the reconciles then queue for one until a read's block ends.
func clusterPoolSize() int { return 10*runtime.GOMAXPROCS(0) + clusterBlockingReads }

// parseClusterURL reads scheme+cluster://[user:password@]host:port[,host:port...][?options]
// into go-redis's form, redis://host:port?addr=host:port&..., whose options it then accepts
// (dial_timeout, pool_size, ...). A cluster has only database 0, so a path is refused rather
// than silently ignored.
func parseClusterURL(raw string) (*redis.ClusterOptions, error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	userinfo, hosts := "", authority
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, hosts = authority[:i+1], authority[i+1:]
	}
	path, rawQuery, _ := strings.Cut(tail, "?")
	if path != "" && path != "/" {
		return nil, fmt.Errorf("a Redis Cluster has only database 0: drop %q from the URL", path)
	}
	query, err := neturl.ParseQuery(rawQuery)
	if err != nil {
		return nil, err
	}
	addrs := strings.Split(hosts, ",")
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("cluster node %q is not host:port: %w", a, err)
		}
	}
	for _, a := range addrs[1:] {
		query.Add("addr", a)
	}
	return redis.ParseClusterURL(strings.TrimSuffix(scheme, "+cluster") + "://" + userinfo + addrs[0] + "?" + query.Encode())
}

// demoSeeds are the instances make run starts with, in the demo catalogue's projects.
var demoSeeds = []instance.CreateRequest{
	{OrganizationID: "acme", ProjectID: "web", NetworkID: "net-acme-web-eu", Name: "web-1", FlavorID: "g1.small", ImageID: "ubuntu-24.04"},
	{OrganizationID: "acme", ProjectID: "web", NetworkID: "net-acme-web-eu", Name: "web-2", FlavorID: "g1.small", ImageID: "ubuntu-24.04"},
	{OrganizationID: "acme", ProjectID: "data", NetworkID: "net-acme-data-eu", Name: "db-1", FlavorID: "g1.medium", ImageID: "rocky-9"},
	{OrganizationID: "globex", ProjectID: "prod", NetworkID: "net-globex-prod-eu", Name: "shop-1", FlavorID: "g1.small", ImageID: "ubuntu-24.04"},
}

// seedDemo creates the demo instances as the demo administrator, so that the dashboard is
// alive on first look; the workers then build them like any other. One that is refused is
// logged and skipped: the demo must start all the same.
func seedDemo(ctx context.Context, svc *instance.Service, cat *region.Catalog, log *slog.Logger) {
	p := auth.Principal{Subject: "demo-admin"}
	for _, o := range cat.Organizations {
		p.Grants = append(p.Grants, auth.Grant{OrganizationID: o.ID, Role: auth.RoleAdmin})
	}
	ctx = auth.WithPrincipal(ctx, p)
	for _, req := range demoSeeds {
		if _, err := svc.Create(ctx, req); err != nil {
			log.Warn("demo instance not created", "name", req.Name, "err", err)
		}
	}
}

// demoAdminTTL is how long the printed admin token lives: a working day of trying things out.
const demoAdminTTL = 24 * time.Hour

func printWelcome(out io.Writer, keys *auth.Keys, cat *region.Catalog, addr string, embedded bool) error {
	p := auth.Principal{Subject: "demo-admin"}
	for _, o := range cat.Organizations {
		p.Grants = append(p.Grants, auth.Grant{OrganizationID: o.ID, Role: auth.RoleAdmin})
	}
	store := "Redis: " + "external"
	if embedded {
		store = "Redis: embedded, in memory (data is lost on exit; use --redis for a real one)"
	}
	token, err := keys.Mint(p, time.Now(), demoAdminTTL)
	if errors.Is(err, auth.ErrNoSecret) {
		// Tokens come from the identity provider: there is nothing to print.
		_, err = fmt.Fprintf(out, "computeql is running.\n  Dashboard: http://%[1]s/\n  GraphiQL:  http://%[1]s/graphiql\n  GraphQL:   http://%[1]s/graphql\n  %[2]s\nTokens: from the configured issuer (--jwks-file / --oidc-issuer).\n", addr, store)
		return err
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, `computeql is running.
  Dashboard: http://%[1]s/#token=%[2]s
  GraphiQL:  http://%[1]s/graphiql#token=%[2]s
  GraphQL:   http://%[1]s/graphql
  %[3]s
Admin token for the demo organizations (valid %[4]s):
  %[2]s
`, addr, token, store, demoAdminTTL)
	return err
}

func mintToken(args []string, out io.Writer) error {
	var c config
	fs := flag.NewFlagSet("computeql token", flag.ContinueOnError)
	fs.SetOutput(out)
	tokenFlags(fs, &c, "HS256 secret to sign with, at least 32 bytes: the servers' --token-secret (required)")
	subject := fs.String("subject", "", "the principal's subject (required)")
	org := fs.String("org", "", "organization of a grant")
	project := fs.String("project", "", "project of the --org grant (none: the whole organization)")
	roleName := fs.String("role", "viewer", "role of the --org grant: viewer, operator, member or admin")
	ttl := fs.Duration("ttl", time.Hour, "how long the token is valid")
	var grants []auth.Grant
	fs.Func("grant", "a grant as org[/project]=role, e.g. acme/web=operator (repeatable)", func(s string) error {
		scope, name, ok := strings.Cut(s, "=")
		o, p, _ := strings.Cut(scope, "/")
		if !ok || o == "" {
			return fmt.Errorf("%q is not org[/project]=role", s)
		}
		role, err := auth.ParseRole(name)
		if err != nil {
			return err
		}
		grants = append(grants, auth.Grant{OrganizationID: o, ProjectID: p, Role: role})
		return nil
	})
	if err := fromEnv(fs); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *subject == "" || (*org == "" && len(grants) == 0) {
		return errors.New("token needs --subject, and --org or --grant")
	}
	if c.tokenSecret == "" {
		return errors.New("token needs --token-secret (or COMPUTEQL_TOKEN_SECRET): the servers must verify with the same secret")
	}
	if *org != "" {
		role, err := auth.ParseRole(*roleName)
		if err != nil {
			return err
		}
		grants = append([]auth.Grant{{OrganizationID: *org, ProjectID: *project, Role: role}}, grants...)
	}
	var orphan error
	fs.Visit(func(f *flag.Flag) {
		if *org == "" && (f.Name == "project" || f.Name == "role") {
			orphan = fmt.Errorf("--%s belongs to the --org grant; use --grant org[/project]=role", f.Name)
		}
	})
	if orphan != nil {
		return orphan
	}
	// The issuer defaults as auth.New defaults it for a server given the same flags, without
	// contacting the OIDC issuer: minting needs only the secret.
	issuer := c.tokenIssuer
	if issuer == "" {
		issuer = c.oidcIssuer
	}
	keys, err := auth.New(auth.Config{Secret: []byte(c.tokenSecret), Issuer: issuer, Audience: c.tokenAudience})
	if err != nil {
		return err
	}
	token, err := keys.Mint(auth.Principal{Subject: *subject, Grants: grants}, time.Now(), *ttl)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, token)
	return err
}
