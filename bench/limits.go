package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/redis/go-redis/v9"
	"github.com/vektah/gqlparser/v2"
	"github.com/vektah/gqlparser/v2/ast"
)

// Limits are what the machine does at best with the same Redis and the same GraphQL server
// library, measured in the same run, so every figure of the system can be read against them.
type Limits struct {
	// Ping is the round trip of PING from one client, one at a time.
	Ping Latency `json:"ping"`
	// XAdd is bare XADDs to one stream from Concurrency clients.
	XAdd Throughput `json:"xadd"`
	// XReadGroup is bare XREADGROUPs of one entry each from one stream by Concurrency
	// clients: the most queue reads a second the Redis answers.
	XReadGroup Throughput `json:"xreadgroup"`
	// Bare is a bare gqlgen handler answering { ping } over loopback HTTP from a process of
	// its own, with the load shapes of the create runs: Concurrency clients (the run of the
	// create phase's median round, Create.Rounds), and the create run's fixed rate.
	Bare     Load `json:"bareGraphQL"`
	BareRate Load `json:"bareGraphQLRate"`
}

// redisLimits measures the round trip and the stream commands on the Redis. keyPrefix
// names the keys it writes, which it deletes afterwards.
func redisLimits(ctx context.Context, rdb *redis.Client, keyPrefix string, pings, ops, clients int) (Limits, error) {
	var l Limits
	lat := make([]time.Duration, 0, pings)
	for range pings {
		t := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			return l, fmt.Errorf("ping: %w", err)
		}
		lat = append(lat, time.Since(t))
	}
	l.Ping = summarize(lat)

	stream := keyPrefix + "xadd"
	defer rdb.Del(context.WithoutCancel(ctx), stream)
	elapsed, err := parallel(ctx, clients, ops, func(i int) error {
		return rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", i}}).Err()
	})
	if err != nil {
		return l, fmt.Errorf("xadd: %w", err)
	}
	l.XAdd = throughput(ops, elapsed)

	// The reads take entries that were already added (in pipelines, not timed), so they
	// measure reading alone.
	if err := rdb.XGroupCreateMkStream(ctx, stream, "bench", "0").Err(); err != nil {
		return l, fmt.Errorf("xgroup create: %w", err)
	}
	var read atomic.Int64
	elapsed, err = parallel(ctx, clients, ops, func(i int) error {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: "bench", Consumer: "c" + strconv.Itoa(i%clients), Streams: []string{stream, ">"}, Count: 1, Block: -1,
		}).Result()
		if err != nil {
			return err
		}
		read.Add(int64(len(res[0].Messages)))
		return nil
	})
	if err != nil {
		return l, fmt.Errorf("xreadgroup: %w", err)
	}
	l.XReadGroup = throughput(int(read.Load()), elapsed)
	return l, nil
}

// parallel calls op for 0..n-1 from clients goroutines and returns how long all took.
func parallel(ctx context.Context, clients, n int, op func(i int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, clients)
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				if err := op(i); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errc)
	if err := errors.Join(<-errc, ctx.Err()); err != nil {
		return 0, err
	}
	return elapsed, nil
}

// pingSchema is the smallest schema gqlgen can serve, type Query { ping: String! }, written
// the way generated code executes it. Served bare, it is what HTTP and gqlgen cost with
// nothing behind them.
type pingSchema struct{ schema *ast.Schema }

var _ graphql.ExecutableSchema = pingSchema{}

func newPingSchema() pingSchema {
	return pingSchema{gqlparser.MustLoadSchema(&ast.Source{Name: "ping.graphqls", Input: "type Query { ping: String! }"})}
}

// Schema implements graphql.ExecutableSchema.
func (p pingSchema) Schema() *ast.Schema { return p.schema }

// Complexity implements graphql.ExecutableSchema.
func (pingSchema) Complexity(context.Context, string, string, int, map[string]any) (int, bool) {
	return 0, false
}

// Exec implements graphql.ExecutableSchema. Only queries validate against the schema.
func (pingSchema) Exec(ctx context.Context) graphql.ResponseHandler {
	oc := graphql.GetOperationContext(ctx)
	fields := graphql.CollectFields(oc, oc.Operation.SelectionSet, []string{"Query"})
	out := graphql.NewFieldSet(fields)
	for i, f := range fields {
		switch f.Name {
		case "__typename":
			out.Values[i] = graphql.MarshalString("Query")
		case "ping":
			out.Values[i] = graphql.MarshalString("pong")
		}
	}
	var buf bytes.Buffer
	out.MarshalGQL(&buf)
	return graphql.OneShot(&graphql.Response{Data: buf.Bytes()})
}

// serveBareProcess is the process the limits run the bare handler in
// (--serve-bare-graphql): one of its own, as the API's is, so that both compete for the
// machine alike. It announces its address on log as computeql's roles do, and serves until
// ctx ends.
func serveBareProcess(ctx context.Context, log io.Writer) error {
	addr, stop, err := serveBare()
	if err != nil {
		return err
	}
	slog.New(slog.NewTextHandler(log, nil)).Info("serving", "addr", addr)
	<-ctx.Done()
	return stop()
}

// serveBare serves the bare handler on a free loopback port until the returned stop is called,
// with the POST transport and the query cache the API itself uses.
func serveBare() (addr string, stop func() error, err error) {
	h := handler.New(newPingSchema())
	h.AddTransport(transport.POST{})
	h.SetQueryCache(lru.New[*ast.QueryDocument](1000))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("bare graphql: listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	// Close, not Shutdown: stop is called after the loads, with nothing in flight, and
	// Shutdown would wait seconds for connections the client dialed but never used.
	stop = func() error {
		err := srv.Close()
		if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		return err
	}
	return ln.Addr().String(), stop, nil
}
