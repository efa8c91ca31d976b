package chaos

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/redistest"
)

// hostileLimits are the API's defaults for what one principal may do, given explicitly: the
// other scenarios lift them for their own load and subscribers.
var hostileLimits = []string{"--rate-limit", "50", "--rate-burst", "100", "--max-sockets-per-principal", "32", "--max-subscriptions-per-principal", "200"}

// TestChaosHostileTenant: one principal, a member of acme with a valid token, using all of the
// default rate limit, floods the API at once with updates of an instance whose every field is at its
// limit, requests of 190 and of 50 history aliases (three at a time), a thousand WebSockets and
// requests under invented operation names, while a bystander of globex queries its instances
// and the scenario's subscribers follow both organizations. The hostile principal may be
// refused (RATE_LIMITED, a closed socket) but nothing may answer INTERNAL; Redis may grow by
// at most 16 KB per update, the API by less than 200 MB, /metrics by at most 50 lines. The
// bystander's latency is reported beside its own baseline from the same run. Then a normal
// load runs, and every invariant must hold.
func TestChaosHostileTenant(t *testing.T) {
	t.Parallel()
	sz := sizeOf(t)
	baselineFor, floodFor := 5*time.Second, 10*time.Second
	if sz.name == "full" {
		baselineFor, floodFor = 10*time.Second, 30*time.Second
	}
	r := harness.StartRedis(t)
	e := newEnv(t, r, envOptions{apis: 2, workers: 2, firstAPIArgs: hostileLimits})
	api := e.apis[0]
	bystander := api.Client(t, e.d.Token(t, "--subject", "bystander", "--grant", "globex=viewer"))
	mallory := api.Client(t, e.d.Token(t, "--subject", "mallory", "--grant", "acme=member"))
	var internals atomic.Int64
	countInternal := func(err error) {
		var gqlErrs harness.Errors
		if errors.As(err, &gqlErrs) && slices.ContainsFunc(gqlErrs, func(e harness.Error) bool { return e.Code() == "INTERNAL" }) {
			internals.Add(1)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	latencies := &latencyLog{}
	var bystanding sync.WaitGroup
	bystanding.Go(func() { queryEvery(ctx, bystander, 100*time.Millisecond, latencies, countInternal) })

	hold(baselineFor)
	baseline := latencies.cut()
	rssBefore := rss(t, api.Pid())
	e.logf("baseline: bystander p99 %s over %d queries; API %d MB", baseline.p99(), len(baseline), rssBefore>>20)

	// Invented operation names, paced under the rate limit so that each runs, after one named
	// operation has made the series an operation's metrics have.
	if err := mallory.Do(ctx, "query First { me { subject } }", nil, nil); err != nil {
		t.Fatal(err)
	}
	linesBefore := metricLines(t, api)
	named := 0
	for tick := time.NewTicker(25 * time.Millisecond); named < 300; named++ {
		<-tick.C
		countInternal(mallory.Do(ctx, fmt.Sprintf("query Junk%d%x { me { subject } }", named, named*7919), nil, nil))
	}
	linesAfter := metricLines(t, api)
	e.logf("%d operations under invented names: /metrics %d lines, then %d", named, linesBefore, linesAfter)
	redisBefore := redistest.UsedMemory(t, e.redis.Client)

	// The flood, all at once.
	maxRef := Ref{Org: "acme", Project: "web", Network: "net-acme-web-eu", Name: "mallory-max"}
	maxID := createMaximal(ctx, t, mallory, e.ledger, maxRef)
	flood, stop := context.WithTimeout(ctx, floodFor)
	defer stop()
	// Under the rate limit, as the hostile principal is: its requests share 45 a second.
	turns := time.NewTicker(time.Second / 45)
	defer turns.Stop()
	turn := func() bool {
		select {
		case <-turns.C:
			return true
		case <-flood.Done():
			return false
		}
	}
	var flooding sync.WaitGroup
	var updates, updatesAcked atomic.Int64
	flooding.Go(func() {
		for n := 1; turn(); n++ {
			desc := strings.Repeat("𝔡", instance.MaxDescription-8) + fmt.Sprintf("%08d", n)
			err := mallory.Do(flood, `mutation($in: UpdateInstanceInput!) { updateInstance(input: $in) { instance { id } userErrors { code } } }`,
				map[string]any{"in": map[string]any{"id": maxID, "description": desc}}, nil)
			if flood.Err() != nil {
				return
			}
			countInternal(err)
			out := Unknown
			if err == nil {
				out = Acked
				updatesAcked.Add(1)
			}
			updates.Add(1)
			e.ledger.Record(maxRef, maxID, Op{Kind: OpUpdate, Outcome: out, At: time.Now(), Spec: Spec{Description: desc, FlavorID: flavors[0]}})
		}
	})
	var bombs, bombsAnswered, bombsRefused atomic.Int64
	// Two of 190 aliases, which no principal's rate limit can pay for at once, and one of 50,
	// which it can when it has saved up.
	for _, aliases := range []int{190, 190, 50} {
		bomb := historyBomb(maxID, aliases)
		flooding.Go(func() {
			for turn() {
				err := mallory.Do(flood, bomb, nil, nil)
				if flood.Err() != nil {
					return
				}
				countInternal(err)
				bombs.Add(1)
				var gqlErrs harness.Errors
				switch {
				case err == nil:
					bombsAnswered.Add(1)
				case errors.As(err, &gqlErrs) && gqlErrs[0].Code() == "RATE_LIMITED":
					bombsRefused.Add(1)
				}
			}
		})
	}
	sockets := &socketFlood{url: strings.Replace(api.URL(), "http://", "ws://", 1) + "/graphql", token: mallory.Token}
	flooding.Go(func() { sockets.run(flood, 1000) })
	var peakRSS atomic.Int64
	peakRSS.Store(rssBefore)
	flooding.Go(func() {
		for flood.Err() == nil {
			if n, err := readRSS(api.Pid()); err == nil {
				peakRSS.Store(max(peakRSS.Load(), n))
			}
			select {
			case <-flood.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	flooding.Wait()
	during := latencies.cut()
	redisAfter := redistest.UsedMemory(t, e.redis.Client)
	sockets.closeAll()
	cancel()
	bystanding.Wait()

	perUpdate := int64(0)
	if n := updatesAcked.Load(); n > 0 {
		perUpdate = (redisAfter - redisBefore) / n
	}
	growth := peakRSS.Load() - rssBefore
	e.logf("flood: %d maximal updates (%d acknowledged), %d history bombs of 190 or 50 aliases (%d answered, %d refused by the rate limit), %d sockets accepted and %d refused of %d",
		updates.Load(), updatesAcked.Load(), bombs.Load(), bombsAnswered.Load(), bombsRefused.Load(), sockets.accepted.Load(), sockets.refused.Load(), sockets.tried.Load())
	e.logf("bystander p99 %s over %d queries (baseline %s); Redis +%d KB per acknowledged update; API +%d MB at its peak; /metrics +%d lines; %d INTERNAL",
		during.p99(), len(during), baseline.p99(), perUpdate>>10, growth>>20, linesAfter-linesBefore, internals.Load())
	switch {
	case internals.Load() > 0:
		t.Errorf("%d answers were INTERNAL", internals.Load())
	case updatesAcked.Load() == 0 || sockets.accepted.Load() == 0 || bombs.Load() == 0:
		t.Errorf("the flood did not get through at all: %d updates acknowledged, %d sockets accepted, %d bombs sent", updatesAcked.Load(), sockets.accepted.Load(), bombs.Load())
	case bombsAnswered.Load()+bombsRefused.Load() != bombs.Load():
		t.Errorf("of %d history bombs, %d were answered and %d refused by the rate limit: the rest failed otherwise", bombs.Load(), bombsAnswered.Load(), bombsRefused.Load())
	case perUpdate > 16<<10:
		t.Errorf("Redis grew by %d bytes per update, want at most 16 KB", perUpdate)
	case growth > 200<<20:
		t.Errorf("the API grew by %d MB, want under 200", growth>>20)
	case linesAfter-linesBefore > 50:
		t.Errorf("/metrics grew by %d lines, want at most 50", linesAfter-linesBefore)
	case sockets.accepted.Load() > 32:
		t.Errorf("one principal held %d sockets, want at most 32", sockets.accepted.Load())
	}

	// The instance goes, and a normal load runs; every invariant must then hold.
	deleteInstance(t, mallory, e.ledger, maxRef, maxID)
	l := &Load{Ops: sz.blipOps, Rate: sz.rate}
	done, _ := e.load(l)
	e.await("the load", done)
	e.finish(l)
	e.report("Hostile tenant", l, fmt.Sprintf("before the load, one member of acme under the default limits: %d operations under invented names, then for %s at once %d updates of an instance with every field at its limit (%d acknowledged), %d requests of 190 or 50 history aliases, 3 at a time (%d answered, %d refused), %d WebSockets opened (%d accepted); bystander of globex p99 %s against %s before; Redis +%.1f KB per update; API +%d MB; /metrics +%d lines; %d INTERNAL",
		named, floodFor, updates.Load(), updatesAcked.Load(), bombs.Load(), bombsAnswered.Load(), bombsRefused.Load(), sockets.tried.Load(), sockets.accepted.Load(), during.p99(), baseline.p99(), float64(perUpdate)/1024, growth>>20, linesAfter-linesBefore, internals.Load()))
}

// createMaximal creates the instance with every field at its limit, in four-byte characters
// where characters are counted, and records it in the ledger.
func createMaximal(ctx context.Context, t *testing.T, c *harness.Client, ledger *Ledger, ref Ref) string {
	t.Helper()
	wide := func(n int) string { return strings.Repeat("𝔵", n) }
	tags := make([]map[string]any, instance.MaxTags)
	for i := range tags {
		tags[i] = map[string]any{"name": fmt.Sprintf("%02d", i) + wide(instance.MaxTagName-2), "value": wide(instance.MaxTagValue)}
	}
	cidrs := make([]string, instance.MaxSourceCIDRs)
	for i := range cidrs {
		cidrs[i] = fmt.Sprintf("10.%d.0.0/16", i)
	}
	spec := Spec{Description: wide(instance.MaxDescription), FlavorID: flavors[0]}
	in := map[string]any{
		"organizationId": ref.Org, "projectId": ref.Project, "networkId": ref.Network, "name": ref.Name,
		"description": spec.Description, "flavorId": spec.FlavorID, "imageId": "ubuntu-24.04", "tags": tags,
		"userData":   base64.StdEncoding.EncodeToString([]byte("#cloud-config\n" + strings.Repeat("#", instance.MaxUserDataBytes-len("#cloud-config\n")))),
		"networking": map[string]any{"allowedSourceAddresses": cidrs},
	}
	var data struct {
		CreateInstance struct {
			Instance   *struct{ ID string }
			UserErrors []struct{ Code, Message string }
		} `json:"createInstance"`
	}
	err := c.Do(ctx, `mutation($in: CreateInstanceInput!) { createInstance(input: $in) { instance { id } userErrors { code message } } }`,
		map[string]any{"in": in}, &data)
	if err != nil || data.CreateInstance.Instance == nil {
		t.Fatalf("create the maximal instance: %v %+v", err, data.CreateInstance.UserErrors)
	}
	ledger.Record(ref, data.CreateInstance.Instance.ID, Op{Kind: OpCreate, Outcome: Acked, At: time.Now(), Spec: spec})
	return data.CreateInstance.Instance.ID
}

func deleteInstance(t *testing.T, c *harness.Client, ledger *Ledger, ref Ref, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), stepLimit)
	defer cancel()
	var data struct {
		DeleteInstance payload `json:"deleteInstance"`
	}
	var err error
	for {
		err = c.Do(ctx, `mutation($in: DeleteInstanceInput!) { deleteInstance(input: $in) { instance { id } userErrors { code } } }`,
			map[string]any{"in": map[string]any{"id": id}}, &data)
		var gqlErrs harness.Errors
		if !errors.As(err, &gqlErrs) || gqlErrs[0].Code() != "RATE_LIMITED" || ctx.Err() != nil {
			break
		}
		hold(time.Second) // the refusal's retryAfter
	}
	out := outcome(err, data.DeleteInstance)
	if out != Acked {
		t.Fatalf("delete %s: %v %+v", ref, err, data.DeleteInstance.UserErrors)
	}
	ledger.Record(ref, id, Op{Kind: OpDelete, Outcome: out, At: time.Now()})
}

// historyBomb is one request of n aliases of the instance's first history event with its
// description, read from the instance for each (with its tags too, the complexity limit
// refuses it).
func historyBomb(id string, n int) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		fmt.Fprintf(&b, ` h%d: instanceEvents(id: %q, first: 1) { edges { node { kind instance { description } } } }`, i, id)
	}
	b.WriteString(" }")
	return b.String()
}

// queryEvery runs the bystander's query every interval until ctx ends, logging latencies.
func queryEvery(ctx context.Context, c *harness.Client, every time.Duration, log *latencyLog, check func(error)) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		start := time.Now()
		err := c.Do(ctx, `{ instances(organizationId: "globex", first: 20) { edges { node { id name status { powerState } } } } }`, nil, nil)
		if ctx.Err() != nil {
			return
		}
		check(err)
		log.add(time.Since(start))
	}
}

// latencyLog collects latencies; cut returns those since the last cut.
type latencyLog struct {
	mu  sync.Mutex
	all durations
}

type durations []time.Duration

func (l *latencyLog) add(d time.Duration) { l.mu.Lock(); l.all = append(l.all, d); l.mu.Unlock() }

func (l *latencyLog) cut() durations {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.all
	l.all = nil
	return out
}

func (d durations) p99() time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*99/100)].Round(100 * time.Microsecond)
}

// socketFlood opens WebSockets with one token until it has tried n, keeping those accepted.
type socketFlood struct {
	url, token               string
	tried, accepted, refused atomic.Int64
	mu                       sync.Mutex
	open                     []*websocket.Conn
}

func (f *socketFlood) run(ctx context.Context, n int) {
	dialer := websocket.Dialer{Subprotocols: []string{"graphql-transport-ws"}, HandshakeTimeout: 5 * time.Second}
	for range n {
		if ctx.Err() != nil {
			return
		}
		f.tried.Add(1)
		conn, _, err := dialer.DialContext(ctx, f.url, nil)
		if err != nil {
			f.refused.Add(1)
			continue
		}
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		var ack struct {
			Type string `json:"type"`
		}
		if conn.WriteJSON(map[string]any{"type": "connection_init", "payload": map[string]any{"authToken": f.token}}) != nil ||
			conn.ReadJSON(&ack) != nil || ack.Type != "connection_ack" {
			f.refused.Add(1)
			conn.Close()
			continue
		}
		conn.SetReadDeadline(time.Time{})
		f.accepted.Add(1)
		f.mu.Lock()
		f.open = append(f.open, conn)
		f.mu.Unlock()
	}
}

func (f *socketFlood) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.open {
		c.Close()
	}
	f.open = nil
}

// rss is the process's resident memory in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	n, err := readRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func readRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for process %d", pid)
}

// metricLines counts the lines of the process's /metrics.
func metricLines(t *testing.T, p *harness.Process) int {
	t.Helper()
	resp, err := http.Get(p.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(body), "\n")
}
