// Command computeql serves the computeql GraphQL API for cloud compute instances.
//
//	computeql [all]   everything in one process (embedded Redis unless --redis is given)
//	computeql api     the GraphQL API only (needs --redis)
//	computeql token   mint a signed token
//
// Every flag can also be set as an environment variable COMPUTEQL_<FLAG>, e.g. COMPUTEQL_REDIS.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/server"
	"github.com/computeql/computeql/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "computeql:", err)
		os.Exit(1)
	}
}

// config is what every role shares.
type config struct {
	listen      string
	redisURL    string
	catalog     string
	tokenSecret string
}

// flags defines the shared flags, each defaulting to its COMPUTEQL_<FLAG> environment variable.
func flags(name string, c *config) *flag.FlagSet {
	fs := flag.NewFlagSet("computeql "+name, flag.ContinueOnError)
	env := func(flagName, def string) string {
		if v, ok := os.LookupEnv("COMPUTEQL_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))); ok {
			return v
		}
		return def
	}
	fs.StringVar(&c.listen, "listen", env("listen", "127.0.0.1:8080"), "address to serve HTTP on")
	fs.StringVar(&c.redisURL, "redis", env("redis", ""), "Redis URL, e.g. redis://127.0.0.1:6379/0 (none: an embedded in-memory Redis)")
	fs.StringVar(&c.catalog, "catalog", env("catalog", ""), "catalogue file (JSON; none: the built-in demo catalogue)")
	fs.StringVar(&c.tokenSecret, "token-secret", env("token-secret", ""), "HS256 secret for bearer tokens, at least 32 bytes (none: a random one, printed tokens only)")
	return fs
}

func run(ctx context.Context, args []string, out io.Writer) error {
	role := "all"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		role, args = args[0], args[1:]
	}
	switch role {
	case "all", "api":
		return serve(ctx, role, args, out)
	case "token":
		return mintToken(args, out)
	case "worker", "region", "bench":
		return fmt.Errorf("the %s role is not available yet in this version", role)
	default:
		return fmt.Errorf("unknown command %q (want all, api, worker, region, token or bench)", role)
	}
}

func serve(ctx context.Context, role string, args []string, out io.Writer) error {
	var c config
	if err := flags(role, &c).Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if role == "api" && c.redisURL == "" {
		return errors.New("api needs --redis: separate roles share nothing but Redis")
	}
	cat := region.Demo()
	if c.catalog != "" {
		var err error
		if cat, err = region.Load(c.catalog); err != nil {
			return err
		}
	}
	secret := []byte(c.tokenSecret)
	if len(secret) == 0 {
		secret = auth.RandomSecret()
	}
	keys, err := auth.NewKeys(secret)
	if err != nil {
		return err
	}

	rdb, closeRedis, err := connect(c.redisURL)
	if err != nil {
		return err
	}
	defer closeRedis()
	st := store.New(rdb)
	if err := st.Load(ctx); err != nil {
		return err
	}
	q, err := queue.New(rdb, queue.Options{})
	if err != nil {
		return err
	}
	if err := q.Setup(ctx); err != nil {
		return err
	}
	svc, err := instance.NewService(instance.Options{Catalog: cat, Store: st, Queue: q, Logger: log})
	if err != nil {
		return err
	}
	h, err := server.New(server.Options{
		Service: svc, Keys: keys, Logger: log,
		Ready: func(ctx context.Context) error { return rdb.Ping(ctx).Err() },
	})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	if role == "all" {
		if err := printWelcome(out, keys, cat, ln.Addr().String(), c.redisURL == ""); err != nil {
			return err
		}
	}
	log.Info("serving", "role", role, "addr", ln.Addr().String())

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Shutdown order: stop accepting and let in-flight requests finish, then close Redis
	// (deferred above), which they may still be using.
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

// connect returns a client of the Redis at url, or of an embedded in-memory Redis when url is
// empty. Both are reached over the same client, so the code paths are the same.
func connect(url string) (redis.UniversalClient, func(), error) {
	if url == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, nil, fmt.Errorf("start embedded redis: %w", err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		return rdb, func() { rdb.Close(); mr.Close() }, nil
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, nil, fmt.Errorf("--redis: %w", err)
	}
	rdb := redis.NewClient(opts)
	return rdb, func() { rdb.Close() }, nil
}

// demoAdminTTL is how long the printed admin token lives: a working day of trying things out.
const demoAdminTTL = 24 * time.Hour

func printWelcome(out io.Writer, keys *auth.Keys, cat *region.Catalog, addr string, embedded bool) error {
	p := auth.Principal{Subject: "demo-admin"}
	for _, o := range cat.Organizations {
		p.Grants = append(p.Grants, auth.Grant{OrganizationID: o.ID, Role: auth.RoleAdmin})
	}
	token, err := keys.Mint(p, time.Now(), demoAdminTTL)
	if err != nil {
		return err
	}
	store := "Redis: " + "external"
	if embedded {
		store = "Redis: embedded, in memory (data is lost on exit; use --redis for a real one)"
	}
	_, err = fmt.Fprintf(out, `computeql is running.
  GraphiQL: http://%[1]s/graphiql#token=%[2]s
  GraphQL:  http://%[1]s/graphql
  %[3]s
Admin token for the demo organizations (valid %[4]s):
  %[2]s
`, addr, token, store, demoAdminTTL)
	return err
}

func mintToken(args []string, out io.Writer) error {
	var c config
	fs := flags("token", &c)
	subject := fs.String("subject", "", "the principal's subject (required)")
	org := fs.String("org", "", "organization of the grant (required)")
	project := fs.String("project", "", "project of the grant (none: the whole organization)")
	roleName := fs.String("role", "viewer", "viewer, operator, member or admin")
	ttl := fs.Duration("ttl", time.Hour, "how long the token is valid")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *subject == "" || *org == "" {
		return errors.New("token needs --subject and --org")
	}
	if c.tokenSecret == "" {
		return errors.New("token needs --token-secret (or COMPUTEQL_TOKEN_SECRET): the servers must verify with the same secret")
	}
	role, err := auth.ParseRole(*roleName)
	if err != nil {
		return err
	}
	keys, err := auth.NewKeys([]byte(c.tokenSecret))
	if err != nil {
		return err
	}
	token, err := keys.Mint(auth.Principal{Subject: *subject, Grants: []auth.Grant{{OrganizationID: *org, ProjectID: *project, Role: role}}}, time.Now(), *ttl)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, token)
	return err
}
