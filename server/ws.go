package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/99designs/gqlgen/graphql"
	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
)

// originPolicy decides which browser origins may open a WebSocket. A request without an
// Origin header (not a browser: scripts, CLIs) and a same-origin request (the Origin's host
// equals the request's Host, as gorilla's default check) are always allowed; AllowedOrigins
// adds cross-origin sites. The check exists because browsers send no CORS preflight for a
// WebSocket: without it any web page could open a socket to the API.
type originPolicy struct {
	any     bool            // "*" was listed
	allowed map[string]bool // normalised "scheme://host[:port]"
}

// newOriginPolicy normalises the allow-list, refusing entries that are not origins.
func newOriginPolicy(origins []string) (originPolicy, error) {
	p := originPolicy{allowed: map[string]bool{}}
	for _, o := range origins {
		if o == "*" {
			p.any = true
			continue
		}
		n, ok := normaliseOrigin(o)
		if !ok {
			return originPolicy{}, fmt.Errorf("server: AllowedOrigins: %q is not an origin (want scheme://host[:port], or *)", o)
		}
		p.allowed[n] = true
	}
	return p, nil
}

// normaliseOrigin lower-cases an origin and drops a default port and a trailing slash, so
// that "https://Dash.example.com:443/" matches the "https://dash.example.com" a browser sends.
func normaliseOrigin(o string) (string, bool) {
	u, err := url.Parse(strings.TrimSpace(o))
	if err != nil || u.Scheme == "" || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return "", false
	}
	scheme, host := strings.ToLower(u.Scheme), strings.ToLower(u.Host)
	if h, port, err := net.SplitHostPort(host); err == nil &&
		(scheme == "https" && port == "443" || scheme == "http" && port == "80") {
		host = h
		if strings.Contains(h, ":") {
			host = "[" + h + "]"
		}
	}
	return scheme + "://" + host, true
}

func (p originPolicy) allows(r *http.Request) bool {
	origins := r.Header["Origin"]
	if len(origins) == 0 {
		return true
	}
	if p.any {
		return true
	}
	if n, ok := normaliseOrigin(origins[0]); ok && p.allowed[n] {
		return true
	}
	u, err := url.Parse(origins[0])
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

// checkOrigin refuses a WebSocket handshake from an origin the policy does not allow with a
// 403 and a GraphQL-shaped body. The transport's Upgrader checks again.
func checkOrigin(p originPolicy, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if websocket.IsWebSocketUpgrade(r) && !p.allows(r) {
			writeError(w, r, http.StatusForbidden, instance.CodeForbidden, "WebSocket origin not allowed: "+r.Header.Get("Origin"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// websocketMetrics observe the WebSocket transport.
type websocketMetrics struct {
	open   prometheus.Gauge
	idle   prometheus.GaugeFunc
	closes *prometheus.CounterVec
	// poller is the transport's, read by idle; set before the server serves.
	poller *idlePoller
}

func newWebsocketMetrics(reg prometheus.Registerer) (*websocketMetrics, error) {
	m := &websocketMetrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "computeql_websocket_connections",
			Help: "Open GraphQL WebSocket connections.",
		}),
		closes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "computeql_websocket_closes_total",
			Help: "WebSocket close frames the server sent, by close code (4401 no token, 4403 bad token, 1009 message too big, 1001 shutdown).",
		}, []string{"code"}),
	}
	m.idle = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "computeql_websocket_idle_connections",
		Help: "GraphQL WebSocket connections waiting for their peer's next message without a goroutine of their own.",
	}, func() float64 { return float64(m.poller.parkedCount()) })
	for _, c := range []prometheus.Collector{m.open, m.idle, m.closes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// closeReason fits a close reason in a control frame (125 bytes, 2 of them the code) without
// splitting a UTF-8 character.
func closeReason(s string) string {
	const max = 123
	if len(s) <= max {
		return s
	}
	s = s[:max]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// onSocket reports whether the operation of ctx arrived on a WebSocket, which authenticates
// once, in connection_init, and may outlive its token; its operations are not HTTP requests
// that the middleware checks one by one.
func onSocket(ctx context.Context) bool { return ctx.Value(wsOpKey{}) != nil }

// socketTokenExpiry refuses an operation sent over a WebSocket whose token has expired since
// connection_init (subscriptions already open end on their own at the expiry). Requests over
// HTTP are verified one by one and need no such check.
type socketTokenExpiry struct{}

var (
	_ graphql.HandlerExtension     = socketTokenExpiry{}
	_ graphql.OperationInterceptor = socketTokenExpiry{}
)

func (socketTokenExpiry) ExtensionName() string                   { return "SocketTokenExpiry" }
func (socketTokenExpiry) Validate(graphql.ExecutableSchema) error { return nil }
func (socketTokenExpiry) InterceptOperation(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
	p, ok := auth.FromContext(ctx)
	if !onSocket(ctx) || !ok || p.ValidAt(time.Now()) {
		return next(ctx)
	}
	return refusal(instance.CodeUnauthenticated, "the token of this connection expired: connect again with a new token")
}

// initToken returns the bearer token of a connection_init payload, "" for none.
func initToken(p map[string]any) (string, error) {
	for _, key := range []string{"Authorization", "authorization", "authToken"} {
		v, ok := p[key]
		if !ok || v == nil || v == "" {
			continue
		}
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("connection_init: %s must be a string", key)
		}
		scheme, token, found := strings.Cut(strings.TrimSpace(s), " ")
		switch {
		case found && strings.EqualFold(scheme, "Bearer"):
			token = strings.TrimSpace(token)
		case key == "authToken" && !found:
			token = scheme
		default:
			return "", fmt.Errorf(`connection_init: %s must be "Bearer <token>"`, key)
		}
		if token == "" {
			return "", fmt.Errorf("connection_init: %s has no token", key)
		}
		return token, nil
	}
	return "", nil
}

// streamDeadlines serves an SSE stream, which lasts as long as its subscription: it lifts the
// http.Server's ReadTimeout (whose expiry would cancel the request's context, ending the stream)
// and WriteTimeout (which would cut the response) and instead bounds every write and flush by
// writeTimeout, so a client that stops reading is dropped and one that reads is kept.
func streamDeadlines(writeTimeout time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The same test the SSE transport serves by, so that every stream it serves (a GET
		// from a browser's EventSource too) outlives the server's timeouts.
		if !(sseTransport{}).Supports(r) {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		// Errors mean the writer has no deadlines (e.g. a test recorder): nothing to lift.
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		next.ServeHTTP(&deadlineWriter{ResponseWriter: w, rc: rc, timeout: writeTimeout}, r)
	})
}

// deadlineWriter sets a write deadline before every write and flush. The stream writes from
// one goroutine at a time (sseStream's lock).
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	return w.ResponseWriter.Write(p)
}

// Flush implements http.Flusher, which the SSE stream flushes every event with.
func (w *deadlineWriter) Flush() {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
