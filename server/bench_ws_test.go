package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/feed"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/store"
)

// apiProcessEnv, set to a Redis address, makes the test binary serve the API as a separate
// process (see TestMain): the subscriber benchmark measures that process's memory alone,
// without its clients'.
const apiProcessEnv = "COMPUTEQL_BENCH_API_REDIS"

// serveAPIProcess serves the API on a free loopback port for the benchmark's clients, prints
// "addr <host:port>" and serves until its stdin closes. /bench/heap answers the heap and
// stacks in use after a garbage collection.
func serveAPIProcess(redisAddr string) error {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 64})
	defer rdb.Close()
	a, stop, err := assemble(rdb, feed.Options{}, func(o *Options) {
		o.RateLimit, o.MaxSocketsPerPrincipal, o.MaxSubscriptionsPerPrincipal = -1, 1<<20, 1<<20 // one principal's subscribers
	})
	if err != nil {
		return err
	}
	defer stop()
	mux := http.NewServeMux()
	mux.Handle("/", a.handler)
	mux.HandleFunc("/bench/heap", func(w http.ResponseWriter, _ *http.Request) {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		fmt.Fprintf(w, "%d %d", m.HeapInuse, m.StackInuse)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	fmt.Printf("addr %s\n", ln.Addr())
	io.Copy(io.Discard, os.Stdin) // until the benchmark closes our stdin
	return srv.Close()
}

// BenchmarkSubscribersWebSocket: subscribers on one API process, each on its own WebSocket
// watching one of 1,000 instances, while 1,000 status changes a second are committed. It
// reports commit → client latency (p50, p99, measured from just before the commit's Redis
// call to the client's read of the message) and the API process's heap and stacks per idle
// subscriber. The API runs as a separate process so its memory is measured alone.
// COMPUTEQL_BENCH_SUBSCRIBERS sets the number of subscribers (default 1,000, so that `make
// test` runs it quickly; docs/performance.md's figures use 10,000).
func BenchmarkSubscribersWebSocket(b *testing.B) {
	const instances, changes = 1000, 1000
	subscribers := 1000
	if v := os.Getenv("COMPUTEQL_BENCH_SUBSCRIBERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < instances {
			b.Fatalf("COMPUTEQL_BENCH_SUBSCRIBERS=%q: want a number of at least %d", v, instances)
		}
		subscribers = n
	}
	for b.Loop() {
		a := newAPI(b, func(o *Options) {
			o.RateLimit, o.MaxSocketsPerPrincipal, o.MaxSubscriptionsPerPrincipal = -1, 1<<20, 1<<20
		})
		admin := a.admin(b)
		a.mustPost(b, admin, `mutation { setQuota(input: {organizationId: "acme", limits: [
			{kind: "servers", limit: 100000}, {kind: "cpus", limit: 1000000}, {kind: "memoryGiB", limit: 1000000}]}) { userErrors { message } } }`, nil)
		insts := make([]*instance.Instance, instances)
		for i := range insts {
			created := a.mustCreate(b, admin, createInput(fmt.Sprint("w", i)))
			insts[i] = &instance.Instance{ID: created.ID, OrganizationID: "acme", StatusVersion: 1}
		}

		addr, heap, stop := startAPIProcess(b, a.rdb.Options().Addr)
		heapBefore := heap()
		clients := dialSubscribers(b, addr, admin, insts, subscribers)
		perSub := float64(heap()-heapBefore) / float64(subscribers)

		st := store.New(a.rdb)
		committed := make([]time.Time, changes)
		var mu sync.Mutex
		tick := time.NewTicker(time.Second / changes)
		for i := range changes {
			<-tick.C
			inst := insts[i%instances]
			mu.Lock()
			committed[i] = time.Now()
			mu.Unlock()
			ok, err := st.WriteStatus(context.Background(), inst, instance.Status{ProvisioningStatus: instance.ProvisioningPending},
				instance.Event{Kind: instance.EventStatusChanged, At: time.Now(), Message: strconv.Itoa(i)})
			if err != nil || !ok {
				b.Fatalf("write status %d: %v %v", i, ok, err)
			}
			inst.StatusVersion++
		}
		tick.Stop()
		var latencies []time.Duration
		for _, c := range clients {
			got := c.wait(b, changes/instances)
			mu.Lock()
			for _, r := range got {
				latencies = append(latencies, r.at.Sub(committed[r.seq]))
			}
			mu.Unlock()
			c.conn.Close()
		}
		stop()

		slices.Sort(latencies)
		b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "p99-ms")
		b.ReportMetric(perSub, "B/subscriber")
		b.ReportMetric(float64(len(latencies)), "deliveries")
	}
}

// startAPIProcess runs the test binary as an API process on the Redis and returns its
// address, a reader of its heap and stacks in use, and its stop.
func startAPIProcess(b *testing.B, redisAddr string) (addr string, heap func() int64, stop func()) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), apiProcessEnv+"="+redisAddr)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if _, ok := strings.CutPrefix(line, "addr "); err != nil || !ok {
		b.Fatalf("API process said %q: %v", line, err)
	}
	addr = strings.TrimSpace(strings.TrimPrefix(line, "addr "))
	heap = func() int64 {
		res, err := http.Get("http://" + addr + "/bench/heap")
		if err != nil {
			b.Fatal(err)
		}
		defer res.Body.Close()
		var inuse, stacks int64
		if _, err := fmt.Fscan(res.Body, &inuse, &stacks); err != nil {
			b.Fatal(err)
		}
		return inuse + stacks
	}
	stop = func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			b.Errorf("API process: %v", err)
		}
	}
	return addr, heap, stop
}

// benchClient is one subscriber: a WebSocket whose reader records when each change arrived.
type benchClient struct {
	conn *websocket.Conn
	got  chan received
}

type received struct {
	seq int
	at  time.Time
}

// dialSubscribers opens n subscriptions, spread evenly over the instances, and returns once
// every one has received its snapshot, so that all are live and idle.
func dialSubscribers(b *testing.B, addr, token string, insts []*instance.Instance, n int) []*benchClient {
	b.Helper()
	clients := make([]*benchClient, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	work := make(chan int)
	for range 64 {
		wg.Go(func() {
			for i := range work {
				c, err := dialSubscriber(addr, token, insts[i%len(insts)].ID)
				if err != nil {
					errs <- fmt.Errorf("subscriber %d: %w", i, err)
					continue
				}
				clients[i] = c
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return clients
}

func dialSubscriber(addr, token, instanceID string) (*benchClient, error) {
	d := websocket.Dialer{Subprotocols: []string{protoTransportWS}, HandshakeTimeout: 30 * time.Second}
	conn, _, err := d.Dial("ws://"+addr+"/graphql", nil)
	if err != nil {
		return nil, err
	}
	conn.SetReadDeadline(time.Now().Add(time.Minute))
	// One document with variables, as clients send it: every subscriber shares its parse.
	const query = `subscription($id: ID) { instanceEvents(organizationId: "acme", instanceId: $id) { kind message } }`
	for _, m := range []any{
		map[string]any{"type": "connection_init", "payload": map[string]any{"Authorization": "Bearer " + token}},
		map[string]any{"type": "subscribe", "id": "s", "payload": map[string]any{"query": query, "variables": map[string]any{"id": instanceID}}},
	} {
		if err := conn.WriteJSON(m); err != nil {
			conn.Close()
			return nil, err
		}
	}
	c := &benchClient{conn: conn, got: make(chan received, 16)}
	snapshot := make(chan error, 1)
	go c.read(snapshot)
	if err := <-snapshot; err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// read reports the snapshot's arrival (or the failure before it), then every change.
func (c *benchClient) read(snapshot chan<- error) {
	defer close(c.got)
	var msg struct {
		Type    string `json:"type"`
		Payload struct {
			Data struct {
				InstanceEvents struct {
					Kind    string  `json:"kind"`
					Message *string `json:"message"`
				} `json:"instanceEvents"`
			} `json:"data"`
			Errors []any `json:"errors"`
		} `json:"payload"`
	}
	live := false
	for {
		if err := c.conn.ReadJSON(&msg); err != nil {
			if !live {
				snapshot <- err
			}
			return
		}
		at := time.Now()
		switch {
		case msg.Type == "ping":
			c.conn.WriteJSON(map[string]string{"type": "pong"})
		case msg.Type == "connection_ack":
		case msg.Type != "next" || len(msg.Payload.Errors) > 0:
			if !live {
				snapshot <- fmt.Errorf("unexpected %s message", msg.Type)
			}
			return
		case msg.Payload.Data.InstanceEvents.Kind == "SNAPSHOT":
			live = true
			snapshot <- nil
		case msg.Payload.Data.InstanceEvents.Message != nil:
			seq, _ := strconv.Atoi(*msg.Payload.Data.InstanceEvents.Message)
			c.got <- received{seq: seq, at: at}
		}
	}
}

// wait returns the first n changes the client received, failing if the stream ends first.
func (c *benchClient) wait(b *testing.B, n int) []received {
	out := make([]received, 0, n)
	for len(out) < n {
		r, ok := <-c.got
		if !ok {
			b.Fatalf("a subscriber's stream ended after %d of %d changes", len(out), n)
		}
		out = append(out, r)
	}
	return out
}
