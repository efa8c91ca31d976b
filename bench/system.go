package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/redisproc"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
	"github.com/computeql/computeql/store"
)

// system is the computeql under test: either one the benchmark started (embedded: a
// redis-server and this binary's api and worker roles as child processes) or one already
// running (target).
type system struct {
	cfg      Config
	apiURL   string // base URL, e.g. http://127.0.0.1:8080
	redisURL string
	secret   string // HS256 secret the API verifies tokens with
	rdb      *redis.Client
	keys     *auth.Keys
	cat      *region.Catalog
	store    *store.Store
	region   *sim.Sim
	// exe is the binary whose processes the benchmark starts (the bare GraphQL server, and
	// the embedded system's roles); dir is the run's directory, for their logs.
	exe string
	dir string
	// Embedded only.
	embedded bool
	redis    *redisproc.Server
	api      *child
	workers  []*child
}

// newSystem starts the embedded system's Redis (the API and workers start per phase), or
// connects to the target's.
func newSystem(ctx context.Context, cfg Config) (*system, error) {
	s := &system{cfg: cfg, embedded: cfg.Target == ""}
	var err error
	if s.cat, err = loadCatalog(cfg.CatalogFile); err != nil {
		return nil, err
	}
	s.secret = cfg.TokenSecret
	if s.exe, err = cfg.binary(); err != nil {
		return nil, err
	}
	if s.dir, err = os.MkdirTemp("", "computeql-bench-"); err != nil {
		return nil, fmt.Errorf("run directory: %w", err)
	}
	if s.embedded {
		if err := s.startRedis(); err != nil {
			s.close()
			return nil, err
		}
		if s.secret == "" {
			s.secret = string(auth.RandomSecret())
		}
	} else {
		s.apiURL, s.redisURL = strings.TrimSuffix(cfg.Target, "/"), cfg.RedisURL
	}
	if s.keys, err = auth.New(auth.Config{Secret: []byte(s.secret)}); err != nil {
		s.close()
		return nil, fmt.Errorf("tokens: %w", err)
	}
	opts, err := redis.ParseURL(s.redisURL)
	if err != nil {
		s.close()
		return nil, fmt.Errorf("--redis: %w", err)
	}
	opts.PoolSize = max(cfg.Concurrency, 16)
	s.rdb = redis.NewClient(opts)
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		s.close()
		return nil, fmt.Errorf("redis at %s: %w", s.redisURL, err)
	}
	s.store = store.New(s.rdb)
	if s.region, err = sim.New(s.rdb, sim.Options{Catalog: s.cat}); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// startRedis prepares the embedded system: the catalogue file its processes read, and a real
// redis-server. The in-memory Redis that `computeql` embeds would measure nothing real.
func (s *system) startRedis() error {
	if err := s.writeCatalog(); err != nil {
		return err
	}
	var err error
	if s.redis, err = redisproc.Start(); err != nil {
		return fmt.Errorf("the embedded benchmark needs a real redis-server on the PATH, as the in-memory Redis of `computeql` would measure nothing real; install one (apt-get install redis-server) or point --target and --redis at a running system: %w", err)
	}
	s.redisURL = "redis://" + s.redis.Addr + "/0"
	return nil
}

// writeCatalog writes the benchmark's catalogue to the run's directory for the processes to
// read, unless --catalog names one.
func (s *system) writeCatalog() error {
	if s.cfg.CatalogFile != "" {
		return nil
	}
	s.cfg.CatalogFile = filepath.Join(s.dir, "catalog.json")
	data, err := benchCatalog()
	if err == nil {
		err = os.WriteFile(s.cfg.CatalogFile, data, 0o600)
	}
	if err != nil {
		return fmt.Errorf("write catalogue: %w", err)
	}
	return nil
}

// roleArgs are the command-line settings every child shares: unlimited requests (the
// benchmark floods on purpose from one principal) and a region that builds at once.
func (s *system) roleArgs(role string) []string {
	// Its subscribers are all one principal's, like its load.
	return []string{role, "--redis", s.redisURL, "--catalog", s.cfg.CatalogFile, "--rate-limit", "-1", "--build-delay", "0",
		"--max-sockets", "1000000", "--max-sockets-per-principal", "1000000", "--max-subscriptions-per-principal", "1000000"}
}

// roleEnv passes the token secret, which the process list should not show.
func (s *system) roleEnv() []string { return []string{"COMPUTEQL_TOKEN_SECRET=" + s.secret} }

// startAPI (embedded) replaces the API process with a fresh one. It serves Go's profiler on
// another loopback port, for --profile and for collecting garbage before memory is read.
func (s *system) startAPI(ctx context.Context) error {
	if err := s.stopAPI(); err != nil {
		return err
	}
	args := append(s.roleArgs("api"), "--listen", "127.0.0.1:0", "--pprof", "127.0.0.1:0")
	c, err := startChild(ctx, s.exe, "api", s.dir, args, s.roleEnv(), servingAPI, servingPprof)
	if err != nil {
		return err
	}
	s.api = c
	s.apiURL = "http://" + c.addrs[servingAPI]
	return nil
}

func (s *system) stopAPI() error {
	if s.api == nil {
		return nil
	}
	err := s.api.stop()
	s.api = nil
	return err
}

// startWorkers (embedded) starts the worker processes. Each also drives the simulated
// region's clock, as in a deployment, and serves its profiler for --profile.
func (s *system) startWorkers(ctx context.Context) error {
	for i := range s.cfg.Workers {
		args := append(s.roleArgs("worker"), "--pprof", "127.0.0.1:0")
		c, err := startChild(ctx, s.exe, "worker-"+strconv.Itoa(i+1), s.dir, args, s.roleEnv(), servingPprof)
		if err != nil {
			return err
		}
		s.workers = append(s.workers, c)
	}
	return nil
}

// reset (embedded) stops every process and empties Redis, so that the next phase starts from
// a clean system.
func (s *system) reset(ctx context.Context) error {
	err := s.stopProcesses()
	if ferr := s.rdb.FlushAll(ctx).Err(); ferr != nil {
		err = errors.Join(err, fmt.Errorf("flush redis: %w", ferr))
	}
	return err
}

// stopProcesses stops the workers first, so that none is left reconciling against an API
// that is gone, then the API.
func (s *system) stopProcesses() error {
	var errs []error
	for _, w := range s.workers {
		errs = append(errs, w.stop())
	}
	s.workers = nil
	errs = append(errs, s.stopAPI())
	return errors.Join(errs...)
}

// close stops everything the benchmark started. Shutdown order: the processes (they use
// Redis), the client, then redis-server, then the run directory.
func (s *system) close() error {
	err := s.stopProcesses()
	if s.rdb != nil {
		s.rdb.Close()
	}
	if s.redis != nil {
		s.redis.Stop()
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
	return err
}

// token mints a token of an admin of the benchmark's organization.
func (s *system) token() (string, error) {
	p := auth.Principal{Subject: "computeql-bench", Grants: []auth.Grant{{OrganizationID: s.cfg.Org, Role: auth.RoleAdmin}}}
	return s.keys.Mint(p, time.Now(), 6*time.Hour)
}

// scope is where the benchmark's servers are.
func (s *system) scope() (region.Scope, error) {
	n, ok := s.cat.Network(s.cfg.Network)
	if !ok {
		return region.Scope{}, fmt.Errorf("network %q is not in the catalogue", s.cfg.Network)
	}
	return region.Scope{OrganizationID: s.cfg.Org, ProjectID: s.cfg.Project, RegionID: n.Region, NetworkID: n.ID}, nil
}

// Memory is what the API process holds, as it reports it at /metrics: resident memory (the
// process collector reads it from /proc), and the Go heap and goroutine stacks in use.
type Memory struct {
	RSS    int64 `json:"rssBytes"`
	Heap   int64 `json:"heapInuseBytes"`
	Stacks int64 `json:"stackInuseBytes"`
}

// apiMemory reads the API process's memory. The embedded API first collects its garbage (a
// heap profile with gc=1 does), so that the heap is what is live; resident memory keeps
// what the runtime has not yet handed back to the system, as the system sees it. A target's
// is read as it is.
func (s *system) apiMemory(ctx context.Context) (Memory, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if s.api != nil {
		if err := get(ctx, "http://"+s.api.addrs[servingPprof]+"/debug/pprof/heap?gc=1", io.Discard); err != nil {
			return Memory{}, fmt.Errorf("API garbage collection: %w", err)
		}
	}
	var metrics bytes.Buffer
	if err := get(ctx, s.apiURL+"/metrics", &metrics); err != nil {
		return Memory{}, fmt.Errorf("API memory: %w", err)
	}
	return parseMemory(&metrics)
}

// get copies the body of a successful GET of url to w. Callers bound it with ctx.
func get(ctx context.Context, url string, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", url, res.StatusCode)
	}
	if _, err := io.Copy(w, res.Body); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// parseMemory reads the three gauges from the Prometheus text format.
func parseMemory(r io.Reader) (Memory, error) {
	var m Memory
	want := map[string]*int64{
		"process_resident_memory_bytes": &m.RSS,
		"go_memstats_heap_inuse_bytes":  &m.Heap,
		"go_memstats_stack_inuse_bytes": &m.Stacks,
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if p, wanted := want[name]; ok && wanted {
			f, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return Memory{}, fmt.Errorf("metric %s: %w", name, err)
			}
			*p = int64(f)
			delete(want, name)
		}
	}
	if err := sc.Err(); err != nil {
		return Memory{}, fmt.Errorf("read metrics: %w", err)
	}
	if len(want) > 0 {
		return Memory{}, fmt.Errorf("the API's /metrics lacks %d of the memory gauges", len(want))
	}
	return m, nil
}

// benchCatalog is the catalogue of an embedded run: one organization with a quota that never
// refuses, one network large enough for every server a run makes, one flavor and one image.
func benchCatalog() ([]byte, error) {
	big := int64(1_000_000_000)
	c := region.Catalog{
		Regions: []region.Region{{ID: "bench-1", Name: "Bench 1"}},
		Organizations: []region.Organization{{ID: "bench", Name: "Bench", Projects: []region.Project{{ID: "load", Name: "Load"}},
			Quota: quota.Amounts{quota.Servers: big, quota.GPUs: big, quota.PublicIPs: big, quota.CPUs: big, quota.MemoryGiB: big}}},
		Networks: []region.Network{{ID: "bench-net", Name: "Bench", OrganizationID: "bench", ProjectID: "load", Region: "bench-1",
			Prefix: netip.MustParsePrefix("10.64.0.0/12")}},
		Flavors: []region.Flavor{{ID: "bench-small", Name: "Small", CPUs: 1, MemoryGiB: 1, DiskGB: 20,
			Architecture: region.ArchitectureX86_64, Regions: []string{"bench-1"}}},
		Images: []region.Image{{ID: "bench-image", Name: "Image", Architecture: region.ArchitectureX86_64, SizeGiB: 1,
			Virtualization: region.VirtualizationAny, State: region.ImageStateReady, Regions: []string{"bench-1"}}},
	}
	return json.MarshalIndent(&c, "", "  ")
}

// loadCatalog reads the catalogue file, or the benchmark's own when path is empty.
func loadCatalog(path string) (*region.Catalog, error) {
	if path != "" {
		return region.Load(path)
	}
	data, err := benchCatalog()
	if err != nil {
		return nil, fmt.Errorf("bench catalogue: %w", err)
	}
	return region.Parse(data)
}

// wsURL is the GraphQL endpoint as a WebSocket URL.
func wsURL(apiURL string) (string, error) {
	u, err := url.Parse(apiURL + "/graphql")
	if err != nil {
		return "", fmt.Errorf("target URL: %w", err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("target URL %q: want http or https", apiURL)
	}
	return u.String(), nil
}
