// Package sim is a simulated cloud region: servers that build, run, stop and get deleted on
// their own schedule, with private IPs from their network's prefix, MACs and public IPs, an
// index by tag, an event stream of every change, and injectable faults. Its state lives in
// Redis, so every process of a deployment sees the same region. It implements region.Client.
package sim

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/region"
)

// All keys share the hash tag {sim}: the simulator's whole state is one Redis Cluster slot,
// which keeps its transactions simple. It stands in for an external cloud, not for load.
const prefix = "sim:{sim}:"

func serverKey(id string) string       { return prefix + "srv:" + id }
func tagKey(tag, value string) string  { return prefix + "tag:" + tag + "=" + value }
func nextIPKey(network string) string  { return prefix + "ipnext:" + network }
func freeIPsKey(network string) string { return prefix + "ipfree:" + network }

const (
	dueKey    = prefix + "due"    // sorted set: server id → when its next transition is due (Unix ms)
	eventsKey = prefix + "events" // stream of server events
	publicSeq = prefix + "pubseq" // counter for public IPs
	eventsCap = 100_000           // events kept (approximately)
	dueBatch  = 500               // transitions applied per tick at most
	// advanceParallel is how many transitions one clock applies at once.
	advanceParallel = 8
	macPrefix       = "fa:16:3e" // the OpenStack prefix, so MACs look familiar
)

// Faults make the simulated region misbehave on purpose.
type Faults struct {
	// ErrorRate is the fraction of calls that fail with region.ErrUnavailable.
	ErrorRate float64 `json:"errorRate,omitempty"`
	// SlowCalls is added to every call.
	SlowCalls time.Duration `json:"slowCalls,omitempty"`
	// FailBuildPrefix makes servers whose name starts with it end in ERROR instead of RUNNING.
	FailBuildPrefix string `json:"failBuildPrefix,omitempty"`
	// DuplicateCreates makes every create make two servers, as a retried cloud call can.
	DuplicateCreates bool `json:"duplicateCreates,omitempty"`
}

// Options configure a simulated region.
type Options struct {
	// Catalog gives networks their prefixes. Required.
	Catalog *region.Catalog
	// BuildDelay is how long a server builds before it runs. Defaults to 0: at the next tick.
	BuildDelay time.Duration
	// DeleteDelay is how long deletion takes. Defaults to 0: at the next tick.
	DeleteDelay time.Duration
	// PowerDelay is how long stopping, starting, rebooting and snapshotting take. Defaults to
	// 0: at the next tick.
	PowerDelay time.Duration
	// Tick is how often due transitions are applied. Defaults to 10ms.
	Tick time.Duration
	// Faults to inject. Defaults to none.
	Faults Faults
	// Now defaults to time.Now.
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Sim is a simulated region. Its methods are safe for concurrent use; Run drives its clock.
type Sim struct {
	rdb  redis.UniversalClient
	opts Options
	// unreachable makes every call fail as a host that cannot be reached does.
	unreachable atomic.Bool
	// consoles are the consoles attached through this process, by server: as on a real
	// host, a newer attachment takes the console from an older one.
	consolesMu sync.Mutex
	consoles   map[string]*echoConsole
}

var _ region.Client = (*Sim)(nil)

// New returns a simulated region on the client.
func New(rdb redis.UniversalClient, opts Options) (*Sim, error) {
	if opts.Catalog == nil {
		return nil, errors.New("sim: Catalog is required")
	}
	if opts.Tick == 0 {
		opts.Tick = 10 * time.Millisecond
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.BuildDelay < 0 || opts.DeleteDelay < 0 || opts.PowerDelay < 0 || opts.Tick < 0 || opts.Faults.SlowCalls < 0 ||
		opts.Faults.ErrorRate < 0 || opts.Faults.ErrorRate > 1 {
		return nil, errors.New("sim: delays (SlowCalls too) must not be negative and ErrorRate must be in [0, 1]")
	}
	return &Sim{rdb: rdb, opts: opts}, nil
}

// SetUnreachable makes the region's host unreachable, or reachable again: while it is, every
// call fails with region.ErrUnreachable and changes nothing, and servers keep their state.
func (s *Sim) SetUnreachable(down bool) { s.unreachable.Store(down) }

// call applies the injected faults to one call.
func (s *Sim) call(ctx context.Context, op string) error {
	if s.unreachable.Load() {
		return fmt.Errorf("%s: simulated outage: %w", op, region.ErrUnreachable)
	}
	if d := s.opts.Faults.SlowCalls; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	if r := s.opts.Faults.ErrorRate; r > 0 && mrand.Float64() < r {
		return fmt.Errorf("%s: injected fault: %w", op, region.ErrUnavailable)
	}
	return nil
}

func (s *Sim) read(ctx context.Context, c redis.Cmdable, id string) (region.Server, error) {
	data, err := c.Get(ctx, serverKey(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return region.Server{}, region.ErrServerNotFound
	}
	if err != nil {
		return region.Server{}, err
	}
	var srv region.Server
	if err := json.Unmarshal(data, &srv); err != nil {
		return region.Server{}, fmt.Errorf("decode server %s: %w", id, err)
	}
	return srv, nil
}

// FindServers implements region.Client through the tag index.
func (s *Sim) FindServers(ctx context.Context, scope region.Scope, tag, value string) ([]region.Server, error) {
	if err := s.call(ctx, "find servers"); err != nil {
		return nil, err
	}
	ids, err := s.rdb.SMembers(ctx, tagKey(tag, value)).Result()
	if err != nil {
		return nil, fmt.Errorf("find servers: %w", err)
	}
	var out []region.Server
	for _, id := range ids {
		srv, err := s.read(ctx, s.rdb, id)
		if errors.Is(err, region.ErrServerNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("find servers: %w", err)
		}
		if srv.Scope == scope {
			out = append(out, srv)
		}
	}
	return out, nil
}

// serversBatch is how many keys Servers reads per round trip.
const serversBatch = 500

// Servers returns every server of the region, in no particular order. It walks the region's
// keys, so it is for audits and tests (does every instance have exactly one server? is any
// orphaned?), not for the request path. On Redis Cluster all of them live on the node that
// holds the {sim} slot, and that node is the one walked.
func (s *Sim) Servers(ctx context.Context) ([]region.Server, error) {
	node := s.rdb
	if cluster, ok := s.rdb.(*redis.ClusterClient); ok {
		master, err := cluster.MasterForKey(ctx, dueKey)
		if err != nil {
			return nil, fmt.Errorf("servers: %w", err)
		}
		node = master
	}
	var out []region.Server
	iter := node.Scan(ctx, 0, serverKey("*"), serversBatch).Iterator()
	var keys []string
	flush := func() error {
		if len(keys) == 0 {
			return nil
		}
		values, err := node.MGet(ctx, keys...).Result()
		if err != nil {
			return err
		}
		for i, v := range values {
			data, ok := v.(string)
			if !ok {
				continue // deleted since the scan
			}
			var srv region.Server
			if err := json.Unmarshal([]byte(data), &srv); err != nil {
				return fmt.Errorf("decode %s: %w", keys[i], err)
			}
			out = append(out, srv)
		}
		keys = keys[:0]
		return nil
	}
	seen := map[string]bool{} // SCAN may return a key twice
	for iter.Next(ctx) {
		if seen[iter.Val()] {
			continue
		}
		seen[iter.Val()] = true
		if keys = append(keys, iter.Val()); len(keys) == serversBatch {
			if err := flush(); err != nil {
				return nil, fmt.Errorf("servers: %w", err)
			}
		}
	}
	if err := errors.Join(iter.Err(), flush()); err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	return out, nil
}

// CreateServer implements region.Client. With DuplicateCreates, a second, identical server is
// made too, and the first is returned.
func (s *Sim) CreateServer(ctx context.Context, spec region.ServerSpec) (region.Server, error) {
	if err := s.call(ctx, "create server"); err != nil {
		return region.Server{}, err
	}
	network, ok := s.opts.Catalog.Network(spec.NetworkID)
	if !ok {
		return region.Server{}, fmt.Errorf("create server: network %q does not exist", spec.NetworkID)
	}
	srv, err := s.create(ctx, spec, network)
	if err == nil && s.opts.Faults.DuplicateCreates {
		_, err = s.create(ctx, spec, network)
	}
	return srv, err
}

func (s *Sim) create(ctx context.Context, spec region.ServerSpec, network *region.Network) (region.Server, error) {
	srv := region.Server{
		ID: uuid.NewString(), ServerSpec: spec, State: region.ServerPending, Health: region.HealthUnknown,
		MAC: randomMAC(), CreatedAt: s.opts.Now().UTC(),
	}
	if spec.Networking.PublicIP {
		ip, err := s.publicIP(ctx)
		if err != nil {
			return region.Server{}, fmt.Errorf("create server: %w", err)
		}
		srv.PublicIP = ip
	}
	ip, err := s.allocate(ctx, network)
	if err != nil {
		return region.Server{}, fmt.Errorf("create server: %w", err)
	}
	srv.PrivateIP = ip
	// The server is new, so nothing can race its write: a plain MULTI suffices.
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		s.write(ctx, p, srv, region.ServerCreated, s.opts.Now())
		return nil
	})
	if err != nil {
		s.rdb.SAdd(context.WithoutCancel(ctx), freeIPsKey(network.ID), ip)
	}
	if err != nil {
		return region.Server{}, fmt.Errorf("create server: %w", err)
	}
	return srv, nil
}

// write stores the server, indexes its tags, schedules its next transition and records the
// event, inside the caller's transaction.
func (s *Sim) write(ctx context.Context, p redis.Pipeliner, srv region.Server, kind region.EventKind, due time.Time) {
	data, _ := json.Marshal(srv) // a Server always encodes
	p.Set(ctx, serverKey(srv.ID), data, 0)
	for tag, value := range srv.Tags {
		p.SAdd(ctx, tagKey(tag, value), srv.ID)
	}
	if _, settled := nextState(srv.State); settled {
		p.ZRem(ctx, dueKey, srv.ID)
	} else {
		p.ZAdd(ctx, dueKey, redis.Z{Score: float64(due.UnixMilli()), Member: srv.ID})
	}
	s.event(ctx, p, kind, srv)
}

func (s *Sim) event(ctx context.Context, p redis.Pipeliner, kind region.EventKind, srv region.Server) {
	tags, _ := json.Marshal(srv.Tags)
	scope, _ := json.Marshal(srv.Scope)
	p.XAdd(ctx, &redis.XAddArgs{Stream: eventsKey, MaxLen: eventsCap, Approx: true,
		Values: []any{"kind", string(kind), "id", srv.ID, "tags", tags, "scope", scope}})
}

// nextState is the state a server moves to on its own, and whether it is settled (moves on
// only when asked).
func nextState(st region.ServerState) (region.ServerState, bool) {
	switch st {
	case region.ServerPending:
		return region.ServerBuilding, false
	case region.ServerBuilding:
		return region.ServerRunning, false
	case region.ServerStopping:
		return region.ServerStopped, false
	case region.ServerStarting, region.ServerRebooting:
		return region.ServerRunning, false
	case region.ServerDeleting:
		return "", false
	}
	return st, true
}

// update changes a server under optimistic locking and records the event. A change that
// returns a zero due time keeps the server's schedule, so that changing networking or health
// does not cut a build or a deletion short. (The due score changes only together with the
// server's key, which is watched.)
func (s *Sim) update(ctx context.Context, id string, change func(*region.Server) (due time.Time, err error)) (region.Server, error) {
	var out region.Server
	err := s.retry(ctx, func(tx *redis.Tx) error {
		srv, err := s.read(ctx, tx, id)
		if err != nil {
			return err
		}
		due, err := change(&srv)
		if err != nil {
			return err
		}
		if due.IsZero() {
			ms, err := tx.ZScore(ctx, dueKey, id).Result()
			switch {
			case err == nil:
				due = time.UnixMilli(int64(ms))
			case errors.Is(err, redis.Nil):
				due = s.opts.Now() // not scheduled: settled, and write leaves it so
			default:
				return err
			}
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			s.write(ctx, p, srv, region.ServerUpdated, due)
			return nil
		})
		out = srv
		return err
	}, serverKey(id))
	return out, err
}

// maxTxAttempts bounds the retries of an optimistic transaction that lost a race with another
// caller (e.g. concurrent creates taking addresses of one network).
const maxTxAttempts = 50

// retry runs an optimistic transaction over the keys until it commits, or fails otherwise.
func (s *Sim) retry(ctx context.Context, fn func(*redis.Tx) error, keys ...string) error {
	for range maxTxAttempts {
		err := s.rdb.Watch(ctx, fn, keys...)
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
	}
	return fmt.Errorf("gave up after %d conflicting attempts: %w", maxTxAttempts, redis.TxFailedErr)
}

// SetHealth changes a server's health as the region's own monitoring would, with an event:
// a change that starts in the region, for tests and failure drills.
func (s *Sim) SetHealth(ctx context.Context, id string, h region.ServerHealth) error {
	_, err := s.update(ctx, id, func(srv *region.Server) (time.Time, error) {
		srv.Health = h
		return time.Time{}, nil // keep the schedule
	})
	if err != nil {
		return fmt.Errorf("set health: %w", err)
	}
	return nil
}

// UpdateNetworking implements region.Client: security groups and source addresses change in
// place; turning the public IP on allocates one and off releases it.
func (s *Sim) UpdateNetworking(ctx context.Context, id string, n region.ServerNetworking) (region.Server, error) {
	if err := s.call(ctx, "update server"); err != nil {
		return region.Server{}, err
	}
	var newIP string
	if n.PublicIP {
		var err error
		if newIP, err = s.publicIP(ctx); err != nil {
			return region.Server{}, fmt.Errorf("update server: %w", err)
		}
	}
	srv, err := s.update(ctx, id, func(srv *region.Server) (time.Time, error) {
		if srv.State == region.ServerDeleting {
			return time.Time{}, fmt.Errorf("server %s is being deleted", id)
		}
		switch {
		case n.PublicIP && srv.PublicIP == "":
			srv.PublicIP = newIP
		case !n.PublicIP:
			srv.PublicIP = ""
		}
		srv.Networking = n
		return time.Time{}, nil // keep the schedule
	})
	if err != nil {
		return region.Server{}, fmt.Errorf("update server: %w", err)
	}
	return srv, nil
}

// errDeleting tells DeleteServer that the server is being deleted already.
var errDeleting = errors.New("server is being deleted already")

// DeleteServer implements region.Client.
func (s *Sim) DeleteServer(ctx context.Context, id string) error {
	if err := s.call(ctx, "delete server"); err != nil {
		return err
	}
	_, err := s.update(ctx, id, func(srv *region.Server) (time.Time, error) {
		if srv.State == region.ServerDeleting {
			// Already on its way out: restarting DeleteDelay (and recording an event) on
			// every repeated delete would put the deletion off indefinitely.
			return time.Time{}, errDeleting
		}
		srv.State = region.ServerDeleting
		return s.opts.Now().Add(s.opts.DeleteDelay), nil
	})
	if errors.Is(err, region.ErrServerNotFound) || errors.Is(err, errDeleting) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete server: %w", err)
	}
	return nil
}

// runErrorLogInterval is the least time between two logged failures of the clock: while Redis
// is unreachable every tick fails, and one line a while says it.
const runErrorLogInterval = 5 * time.Second

// Run applies due transitions every Tick until ctx ends. Several processes may run it at once:
// each transition is applied by whichever wins its optimistic transaction. A failing tick
// (e.g. Redis briefly unreachable) is logged and the clock goes on: the due transitions are
// still due at the next tick.
func (s *Sim) Run(ctx context.Context) error {
	t := time.NewTicker(s.opts.Tick)
	defer t.Stop()
	var lastLogged time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := s.advance(ctx); err != nil && ctx.Err() == nil && time.Since(lastLogged) >= runErrorLogInterval {
			lastLogged = time.Now()
			s.opts.Logger.ErrorContext(ctx, "simulated region: clock tick failed; retrying", "err", err)
		}
	}
}

// advance applies the transitions due now, several at once: each is a transaction of a few
// round trips on its own server, and applied one after another they made the simulated
// region, not the system under it, what limited how fast thousands of servers are built.
func (s *Sim) advance(ctx context.Context) error {
	now := s.opts.Now()
	ids, err := s.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: dueKey, Start: "-inf", Stop: now.UnixMilli(), ByScore: true, Count: dueBatch}).Result()
	if err != nil {
		return fmt.Errorf("sim: due transitions: %w", err)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		slot = make(chan struct{}, advanceParallel)
	)
	for _, id := range ids {
		slot <- struct{}{}
		wg.Go(func() {
			defer func() { <-slot }()
			var err error
			if image, ok := strings.CutPrefix(id, imageDuePrefix); ok {
				err = s.imageReady(ctx, image)
			} else {
				err = s.transition(ctx, id, now)
			}
			if err != nil && !errors.Is(err, redis.TxFailedErr) && !errors.Is(err, region.ErrServerNotFound) {
				mu.Lock()
				errs = append(errs, fmt.Errorf("sim: transition %s: %w", id, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (s *Sim) transition(ctx context.Context, id string, now time.Time) error {
	return s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		srv, err := s.read(ctx, tx, id)
		if errors.Is(err, region.ErrServerNotFound) {
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error { p.ZRem(ctx, dueKey, id); return nil })
			return err
		}
		if err != nil {
			return err
		}
		due, err := tx.ZScore(ctx, dueKey, id).Result()
		if errors.Is(err, redis.Nil) || err == nil && int64(due) > now.UnixMilli() {
			return nil // another clock applied it already (and settled or rescheduled it)
		}
		if err != nil {
			return err
		}
		next, settled := nextState(srv.State)
		if settled {
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error { p.ZRem(ctx, dueKey, id); return nil })
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if srv.State == region.ServerDeleting {
				p.Del(ctx, serverKey(id))
				p.ZRem(ctx, dueKey, id)
				p.SAdd(ctx, freeIPsKey(srv.NetworkID), srv.PrivateIP)
				for tag, value := range srv.Tags {
					p.SRem(ctx, tagKey(tag, value), id)
				}
				s.event(ctx, p, region.ServerDeleted, srv)
				return nil
			}
			srv.State = next
			due := now
			switch {
			case next == region.ServerBuilding:
				due = now.Add(s.opts.BuildDelay)
			case next == region.ServerRunning && s.opts.Faults.FailBuildPrefix != "" && strings.HasPrefix(srv.Name, s.opts.Faults.FailBuildPrefix):
				srv.State, srv.Health = region.ServerError, region.HealthError
				srv.Message = "the server failed to build: no valid host was found for it"
			case next == region.ServerRunning:
				srv.Health = region.HealthHealthy
			}
			s.write(ctx, p, srv, region.ServerUpdated, due)
			return nil
		})
		return err
	}, serverKey(id)) // a second clock applying it first changes the server, failing this
}

// Watch implements region.Client on the event stream.
func (s *Sim) Watch(ctx context.Context, after string, fn func(region.Event) error) error {
	if after == "" {
		// "$" would be re-read on every call; pin "now" to the last id instead.
		last, err := s.rdb.XRevRangeN(ctx, eventsKey, "+", "-", 1).Result()
		if err != nil {
			return fmt.Errorf("watch: %w", err)
		}
		after = "0-0"
		if len(last) == 1 {
			after = last[0].ID
		}
	}
	for ctx.Err() == nil {
		streams, err := s.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{eventsKey, after}, Count: 500, Block: time.Second}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watch: %w", err)
		}
		for _, m := range streams[0].Messages {
			if ctx.Err() != nil {
				// A batch can hold hundreds of events; a watcher that was told to stop must
				// not go on handling them with a context every call now fails.
				return nil
			}
			ev := region.Event{Cursor: m.ID}
			kind, _ := m.Values["kind"].(string)
			ev.Kind = region.EventKind(kind)
			ev.ServerID, _ = m.Values["id"].(string)
			// Both were encoded by event() from a map and a struct, so they decode.
			if tags, ok := m.Values["tags"].(string); ok {
				_ = json.Unmarshal([]byte(tags), &ev.Tags)
			}
			if scope, ok := m.Values["scope"].(string); ok {
				_ = json.Unmarshal([]byte(scope), &ev.Scope)
			}
			if err := fn(ev); err != nil {
				return err
			}
			after = m.ID
		}
	}
	return nil
}

// publicIP allocates a public address. The simulator hands out addresses of 100.64.0.0/10 in
// order: unique, and plainly not anybody's real address.
func (s *Sim) publicIP(ctx context.Context) (string, error) {
	n, err := s.rdb.Incr(ctx, publicSeq).Result()
	if err != nil {
		return "", err
	}
	base := netip.MustParseAddr("100.64.0.0").As4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(n % (1 << 22))
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String(), nil
}

// allocate takes a private address of the network: one released by a deleted server, or the
// next never used. Both are single atomic commands, so concurrent creates never collide and
// never scan the network's addresses. The network address, the first ten (gateways and
// services, as clouds reserve them) and the broadcast address are never handed out.
func (s *Sim) allocate(ctx context.Context, network *region.Network) (string, error) {
	ip, err := s.rdb.SPop(ctx, freeIPsKey(network.ID)).Result()
	if err == nil {
		return ip, nil
	}
	if !errors.Is(err, redis.Nil) {
		return "", err
	}
	n, err := s.rdb.Incr(ctx, nextIPKey(network.ID)).Result()
	if err != nil {
		return "", err
	}
	addr, ok := hostAddress(network.Prefix, 9+n)
	if !ok {
		return "", fmt.Errorf("network %s has no free address", network.ID)
	}
	return addr.String(), nil
}

// hostAddress returns the address at offset from the network address, if it is a host address
// of the prefix (not the broadcast address).
func hostAddress(p netip.Prefix, offset int64) (netip.Addr, bool) {
	base := p.Masked().Addr().As4()
	v := uint64(base[0])<<24 | uint64(base[1])<<16 | uint64(base[2])<<8 | uint64(base[3])
	v += uint64(offset)
	a := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	if v > 0xffffffff || !p.Contains(a) || !p.Contains(a.Next()) {
		return netip.Addr{}, false
	}
	return a, true
}

func randomMAC() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return fmt.Sprintf("%s:%02x:%02x:%02x", macPrefix, b[0], b[1], b[2])
}
