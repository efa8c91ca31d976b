// Package server is computeql's HTTP edge: the GraphQL transports, bearer-token
// authentication, request limits, the dashboard, the GraphiQL page and health endpoints.
package server

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/feed"
	"github.com/computeql/computeql/graph"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/server/dashboard"
	"github.com/computeql/computeql/server/graphiql"
	"github.com/computeql/computeql/server/webasset"
)

// Options configure the HTTP handler.
type Options struct {
	// Service applies the instance rules. Required.
	Service *instance.Service
	// Feed delivers instance events to subscriptions. Required.
	Feed *feed.Feed
	// Keys verify bearer tokens. Required.
	Keys *auth.Keys
	// Ready reports whether the process can serve (e.g. Redis answers). Defaults to always ready.
	Ready func(context.Context) error
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// MaxBodyBytes caps a request body, and one WebSocket message (a larger one closes the
	// socket with 1009). Defaults to 1 MiB.
	MaxBodyBytes int64
	// MaxTokens caps the tokens the parser reads from one document. Defaults to 10,000.
	MaxTokens int
	// MaxDepth caps field nesting. Defaults to 12.
	MaxDepth int
	// MaxComplexity caps an operation's complexity, lists weighted by page size. Defaults to 20,000.
	MaxComplexity int
	// MaxStoreCallsPerRequest caps the store calls one operation runs at once (its root fields
	// and list items are resolved concurrently). Defaults to 4.
	MaxStoreCallsPerRequest int
	// MaxFields caps an operation's field selections with fragments expanded. Defaults to 5,000.
	MaxFields int
	// MaxWidth caps the fields of one selection set, fragments flattened. Defaults to 200.
	MaxWidth int
	// MaxMergeComparisons caps what checking that fields of the same response name in one
	// selection set can be merged may compare, in field pairs weighed by what they select.
	// Defaults to 100,000.
	MaxMergeComparisons int
	// Registry receives the metrics served at /metrics. Defaults to a new registry with the Go
	// and process collectors.
	Registry *prometheus.Registry
	// DisableIntrospection turns introspection off. It is on by default: GraphiQL and clients'
	// code generators need it, and the schema is public.
	DisableIntrospection bool

	// AllowedOrigins lists the browser origins ("https://dash.example.com", scheme://host[:port])
	// besides the API's own that may open a WebSocket to /graphql; "*" allows any. Empty means
	// same-origin only: the handshake is refused (403) when it carries an Origin header whose
	// host differs from the request's Host. Requests without an Origin (scripts, CLIs) are always
	// allowed. Behind a proxy that rewrites Host, list the public origin.
	AllowedOrigins []string
	// KeepAliveInterval is how often WebSocket and SSE streams send keep-alives: "ka" messages
	// (graphql-ws), "ping" messages (graphql-transport-ws; a client that does not answer with
	// "pong" within twice the interval is dropped), WebSocket ping frames (a peer silent for twice
	// the interval is dropped), and SSE comments. Defaults to 15s; negative turns them all off.
	KeepAliveInterval time.Duration
	// BookmarkInterval is how often a subscription with allowBookmarks gets a BOOKMARK while
	// events it does not match pass by. Defaults to 5 s.
	BookmarkInterval time.Duration
	// StreamWriteTimeout bounds every write to a WebSocket (message, ping, close frame) or an SSE
	// stream; a client that does not take one within it is disconnected. Defaults to 10s.
	StreamWriteTimeout time.Duration

	// RateLimit is the requests per second one principal (a token's subject) may sustain, in
	// this process. Every authenticated HTTP request (POST, GET, SSE) counts once, and every
	// operation started over a WebSocket (the handshake itself does not count); one over the
	// limit is refused with RATE_LIMITED and extensions.retryAfter, over HTTP with status 429
	// and a Retry-After header. Defaults to 50; negative turns limiting off.
	RateLimit float64
	// RateBurst is how many requests a principal may send at once after a quiet spell: the size
	// of its token bucket. Defaults to 100.
	RateBurst int
	// MaxSockets bounds the WebSockets this process holds open; a handshake past it is refused
	// with 429 and Retry-After. Defaults to 10,000.
	MaxSockets int
	// MaxSocketsPerPrincipal bounds the WebSockets one principal holds open in this process
	// (a dashboard needs one); connection_init past it closes the socket with 4429. Defaults
	// to 32.
	MaxSocketsPerPrincipal int
	// MaxSubscriptionsPerSocket bounds the subscriptions running on one WebSocket; one past it
	// is refused with RATE_LIMITED. Defaults to 100.
	MaxSubscriptionsPerSocket int
	// MaxSubscriptionsPerPrincipal bounds the subscriptions one principal runs in this process,
	// over every transport; one past it is refused with RATE_LIMITED. Defaults to 200.
	MaxSubscriptionsPerPrincipal int
	// MaxConsoles bounds the serial consoles attached through this process (each holds a host
	// stream and its buffers: about 4.5 MiB on a libvirt host); one past it is refused with
	// 429. Defaults to 32.
	MaxConsoles int
	// MaxConsolesPerPrincipal bounds the consoles one principal has attached through this
	// process; one past it is refused with 429. Defaults to 4.
	MaxConsolesPerPrincipal int
	// PublicURL is where clients reach the API ("https://api.example.com"), from which the
	// URLs it hands out (a console session's) are made. Empty means as each request reached
	// it: its Host header, and https when it came over TLS or with X-Forwarded-Proto: https.
	PublicURL string
	// Context bounds the WebSockets, which outlive their HTTP requests: when it ends, each is
	// closed with 1001 (going away). Defaults to context.Background().
	Context context.Context
	// now is the rate limiter's clock, which tests set. Defaults to time.Now.
	now func() time.Time
	// initTimeout bounds the wait for a WebSocket's connection_init, which tests shorten.
	// Defaults to 10 s.
	initTimeout time.Duration
}

func (o *Options) applyDefaults() error {
	if o.Service == nil || o.Feed == nil || o.Keys == nil {
		return errors.New("server: Service, Feed and Keys are required")
	}
	if o.Context == nil {
		o.Context = context.Background()
	}
	if o.Ready == nil {
		o.Ready = func(context.Context) error { return nil }
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Logger = slog.New(withRequestID{o.Logger.Handler()})
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
		o.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 1 << 20
	}
	o.MaxSockets = cmp.Or(o.MaxSockets, 10_000)
	o.MaxSocketsPerPrincipal = cmp.Or(o.MaxSocketsPerPrincipal, 32)
	o.MaxSubscriptionsPerSocket = cmp.Or(o.MaxSubscriptionsPerSocket, 100)
	o.MaxSubscriptionsPerPrincipal = cmp.Or(o.MaxSubscriptionsPerPrincipal, 200)
	o.MaxConsoles = cmp.Or(o.MaxConsoles, 32)
	o.MaxConsolesPerPrincipal = cmp.Or(o.MaxConsolesPerPrincipal, 4)
	if o.MaxTokens == 0 {
		o.MaxTokens = 10_000
	}
	if o.MaxDepth == 0 {
		o.MaxDepth = 12
	}
	if o.MaxComplexity == 0 {
		o.MaxComplexity = 20_000
	}
	o.MaxStoreCallsPerRequest = cmp.Or(o.MaxStoreCallsPerRequest, 4)
	if o.MaxFields == 0 {
		o.MaxFields = 5_000
	}
	if o.MaxWidth == 0 {
		o.MaxWidth = 200
	}
	o.MaxMergeComparisons = cmp.Or(o.MaxMergeComparisons, 100_000)
	if o.KeepAliveInterval == 0 {
		o.KeepAliveInterval = 15 * time.Second
	}
	if o.KeepAliveInterval < 0 {
		o.KeepAliveInterval = 0
	}
	if o.StreamWriteTimeout == 0 {
		o.StreamWriteTimeout = 10 * time.Second
	}
	if o.StreamWriteTimeout < 0 {
		return errors.New("server: StreamWriteTimeout must not be negative")
	}
	if math.IsNaN(o.RateLimit) {
		return errors.New("server: RateLimit is not a number")
	}
	if o.RateLimit == 0 {
		o.RateLimit = 50
	}
	if o.RateBurst == 0 {
		o.RateBurst = 100
	}
	if o.now == nil {
		o.now = time.Now
	}
	o.initTimeout = cmp.Or(o.initTimeout, 10*time.Second)
	return nil
}

// New returns the HTTP handler of every computeql path.
func New(opts Options) (http.Handler, error) {
	if err := opts.applyDefaults(); err != nil {
		return nil, err
	}
	origins, err := newOriginPolicy(opts.AllowedOrigins)
	if err != nil {
		return nil, err
	}
	wsMetrics, err := newWebsocketMetrics(opts.Registry)
	if err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	limits, err := newConnLimits(opts, opts.Registry)
	if err != nil {
		return nil, err
	}
	gql := handler.New(graph.NewSchema(opts.Service, opts.Feed, opts.BookmarkInterval))
	// The first transport that supports a request serves it: WebSocket (an Upgrade to one)
	// first, and SSE before GET and POST, whose checks ignore Accept.
	gql.AddTransport(newWSTransport(opts, origins, limits, wsMetrics))
	gql.AddTransport(sseTransport{keepAlive: opts.KeepAliveInterval})
	gql.AddTransport(getTransport{})
	gql.AddTransport(postTransport{})
	gql.AddTransport(unsupported{})
	// Shared by every caller, so bounded by bytes: a parsed and validated document weighs 10
	// to 80 times its text, the most for short names in deep sets.
	queries := newBoundedCache(1000, 64<<20, func(q string, _ *ast.QueryDocument) int { return 128 * len(q) })
	gql.SetQueryCache(queries)
	gql.SetParserTokenLimit(opts.MaxTokens)
	// Suggestions ("Did you mean …?") compare every unknown name with every name of its type,
	// for every place it fails: work a caller chooses, for what GraphiQL offers anyway.
	gql.SetDisableSuggestion(true)
	gql.SetErrorPresenter(graph.ErrorPresenter(opts.Logger))
	gql.SetRecoverFunc(graph.Recover(opts.Logger))
	gql.Use(graph.SubscriptionEndings{})
	gql.Use(socketTokenExpiry{})
	gql.Use(subscriptionLimit{limits})
	// The rate limit is the first extension, so that a refused operation costs nothing else.
	rateLimited := func(h http.Handler) http.Handler { return h }
	var rl *rateLimit
	if opts.RateLimit >= 0 {
		if rl, err = newRateLimit(opts.RateLimit, opts.RateBurst, opts.now, opts.Registry); err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		gql.Use(rl)
		rateLimited = rl.middleware
	}
	if !opts.DisableIntrospection {
		gql.Use(extension.Introspection{})
	}
	gql.Use(extension.AutomaticPersistedQuery{Cache: newBoundedCache(1000, 16<<20, func(hash, q string) int { return len(hash) + len(q) })})
	gql.Use(documentGate{budget: documentBudget{maxFields: opts.MaxFields, maxWidth: opts.MaxWidth, maxPairs: opts.MaxMergeComparisons}, maxTokens: opts.MaxTokens, cache: queries})
	gql.Use(depthLimit{max: opts.MaxDepth})
	gql.Use(complexityLimit{extension.FixedComplexityLimit(opts.MaxComplexity)})
	gql.Use(queryCost{rl})
	gql.Use(storeCallLimit{opts.MaxStoreCallsPerRequest})
	metrics, err := newOpMetrics(opts.Registry)
	if err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	gql.Use(metrics)
	gql.Use(graph.Audit{Log: opts.Logger})
	useTracing(gql)

	mux := http.NewServeMux()
	public, err := newPublicURL(opts.PublicURL)
	if err != nil {
		return nil, err
	}
	mux.Handle("/graphql", checkOrigin(origins, limitBody(opts.MaxBodyBytes, authenticate(opts.Keys, opts.Service.RedeemTicket, rateLimited(streamDeadlines(opts.StreamWriteTimeout, public.mark(gql)))))))
	consoles, err := newConsoleHandler(opts, origins, limits)
	if err != nil {
		return nil, err
	}
	mux.Handle("GET "+graph.ConsolePath+"{token}", checkOrigin(origins, consoles))
	gi := graphiql.Handler("/graphiql", "/graphql")
	mux.Handle("/graphiql", gi)
	mux.Handle("/graphiql/", gi)
	opsRoutes(mux, opts.Registry, opts.Ready, opts.Logger)
	dash := dashboard.Handler("/graphql", "/graphiql")
	mux.Handle("/{$}", dash)
	mux.Handle(dashboard.AssetsDir, dash)
	mux.Handle("/favicon.ico", webasset.Favicon())
	return logRequests(opts.Logger, mux), nil
}

// Ops is the handler of the operational paths alone, /metrics, /healthz and /readyz, for
// processes that serve no API (workers, the region's clock): the API serves the same paths
// beside /graphql.
func Ops(reg prometheus.Gatherer, ready func(context.Context) error, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	opsRoutes(mux, reg, ready, log)
	return mux
}

// opsRoutes adds /metrics; /healthz, which answers while the process runs; and /readyz,
// which answers only while ready does (within 2 s).
func opsRoutes(mux *http.ServeMux, reg prometheus.Gatherer, ready func(context.Context) error, log *slog.Logger) {
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := ready(ctx); err != nil {
			log.WarnContext(ctx, "not ready", "err", err)
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
}

// authenticate admits only requests with a valid bearer token and puts the principal in the
// request context. Every GraphQL request needs one: the API is never open. The exception is a
// WebSocket handshake without an Authorization header, since browsers cannot set headers on
// one: it is let through, and the connection authenticates in its connection_init message
// (wsConn.init) before any operation runs. A handshake that does carry the header is checked
// here like any request.
func authenticate(keys *auth.Keys, redeem func(context.Context, string) (auth.Principal, error), next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.Header.Get("Authorization") == "" && websocket.IsWebSocketUpgrade(r) {
			next.ServeHTTP(w, r)
			return
		}
		// An event stream a client opens with a GET it cannot add headers to (EventSource)
		// carries a stream ticket instead of the token.
		// Only a GET the SSE transport serves: a ticket is never spent on another request.
		if ticket := r.URL.Query().Get("ticket"); ticket != "" && r.Method == http.MethodGet && r.Header.Get("Authorization") == "" &&
			(sseTransport{}).Supports(r) {
			p, err := redeem(r.Context(), ticket)
			if err != nil {
				status, code, msg := http.StatusUnauthorized, instance.CodeUnauthenticated, "the stream ticket is unknown, used or expired: ask for another with createStreamTicket"
				if !errors.Is(err, instance.ErrNoTicket) {
					status, code, msg = http.StatusServiceUnavailable, instance.CodeUnavailable, "the store did not answer; retry"
				}
				writeError(w, r, status, code, msg)
				return
			}
			requestInfoFrom(r.Context()).set(p.Subject, "")
			next.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), p)))
			return
		}
		// The scheme is case-insensitive (RFC 7235).
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="computeql"`)
			writeError(w, r, http.StatusUnauthorized, instance.CodeUnauthenticated, "authentication required: send Authorization: Bearer <token>")
			return
		}
		p, err := keys.Verify(token)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="computeql", error="invalid_token"`)
			writeError(w, r, http.StatusUnauthorized, instance.CodeUnauthenticated, err.Error())
			return
		}
		requestInfoFrom(r.Context()).set(p.Subject, "")
		next.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), p)))
	})
}

// limitBody refuses bodies over max bytes, at once when the length is declared and otherwise
// when reading passes it. Reading the (bounded) body here gives the refusal a status and a
// code; the transports refuse a body that is not a GraphQL request (decodeRequest).
func limitBody(max int64, next http.Handler) http.Handler {
	tooLarge := "request body is larger than the limit of " + strconv.FormatInt(max, 10) + " bytes"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > max {
			writeError(w, r, http.StatusRequestEntityTooLarge, instance.CodeBadUserInput, tooLarge)
			return
		}
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			writeError(w, r, http.StatusRequestEntityTooLarge, instance.CodeBadUserInput, tooLarge)
			return
		case err != nil:
			writeError(w, r, http.StatusBadRequest, instance.CodeBadUserInput, "could not read the request body")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}
