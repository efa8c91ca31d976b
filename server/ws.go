package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
)

// WebSocket close codes of the graphql-transport-ws protocol for a refused connection_init.
// The legacy graphql-ws protocol names none; it gets the same codes, after a connection_error
// message that carries the reason.
const (
	// CloseUnauthorized (4401): connection_init carried no token.
	CloseUnauthorized = 4401
	// CloseForbidden (4403): connection_init carried a token that is malformed or does not verify.
	CloseForbidden = 4403
)

// The GraphQL subprotocols, in order of preference: when a client offers both, it gets the
// current one.
var websocketSubprotocols = []string{"graphql-transport-ws", "graphql-ws"}

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
// 403 and a GraphQL-shaped body. The adapter's Upgrader checks again; checking here first
// gives the refusal its status, which gqlgen's transport would turn into a 400.
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
	closes *prometheus.CounterVec
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
	for _, c := range []prometheus.Collector{m.open, m.closes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// gorillaWebsocket implements gqlgen's transport.WebsocketImplementation with
// gorilla/websocket. Its connections enforce a read limit (set by the transport), a read
// deadline that every pong or message from the peer extends, and a write deadline on every
// write; it checks origins and pings the peer with WebSocket ping frames.
type gorillaWebsocket struct {
	upgrader websocket.Upgrader
	// writeTimeout bounds every write: a message, a ping, a pong, a close frame.
	writeTimeout time.Duration
	// pingInterval is how often the peer gets a ping frame; 0 sends none. Browsers and
	// WebSocket libraries answer with a pong by themselves.
	pingInterval time.Duration
	// pongWait is how long the peer may stay silent (no pong, no message) before the
	// connection is dropped; 0 never drops it. This is what finds dead peers on the legacy
	// graphql-ws protocol, which has no ping of its own.
	pongWait time.Duration
	metrics  *websocketMetrics
}

var _ transport.WebsocketImplementation = (*gorillaWebsocket)(nil)

func newGorillaWebsocket(origins originPolicy, writeTimeout, pingInterval time.Duration, m *websocketMetrics) *gorillaWebsocket {
	g := &gorillaWebsocket{
		upgrader: websocket.Upgrader{
			HandshakeTimeout: writeTimeout,
			// Client messages (init, subscribe, stop) are small; a larger one still fits, read in
			// several pieces. Write buffers come from a pool and are held only while a message is
			// being written, so an idle subscriber holds none.
			ReadBufferSize:  1024,
			WriteBufferSize: 4096,
			WriteBufferPool: &sync.Pool{},
			Subprotocols:    slices.Clone(websocketSubprotocols),
			CheckOrigin:     origins.allows,
			// gqlgen answers a failed upgrade itself (400 "unable to upgrade"); writing here too
			// would write the response twice.
			Error: func(http.ResponseWriter, *http.Request, int, error) {},
		},
		writeTimeout: writeTimeout,
		metrics:      m,
	}
	if pingInterval > 0 {
		g.pingInterval, g.pongWait = pingInterval, 2*pingInterval
	}
	return g
}

// acceptedKey carries an *acceptedSlot in the request context from websocketTransport.Do to
// Accept, so that Do can close what gqlgen forgot to close.
type acceptedKey struct{}

type acceptedSlot struct {
	conn *gorillaConn
	// release gives back the principal's socket that connection_init took, at the socket's end.
	release func()
}

func (g *gorillaWebsocket) Accept(w http.ResponseWriter, r *http.Request, options transport.WebsocketAcceptOptions) (transport.WebsocketConn, error) {
	u := g.upgrader
	for _, p := range options.Subprotocols {
		if !slices.Contains(u.Subprotocols, p) {
			u.Subprotocols = append(slices.Clip(u.Subprotocols), p)
		}
	}
	ws, err := u.Upgrade(w, r, options.ResponseHeader)
	if err != nil {
		return nil, err
	}
	c := &gorillaConn{ws: ws, ctx: r.Context(), writeTimeout: g.writeTimeout, pongWait: g.pongWait, metrics: g.metrics, done: make(chan struct{})}
	if g.metrics != nil {
		g.metrics.open.Inc()
	}
	ws.SetPongHandler(func(string) error {
		c.extendLiveness()
		return nil
	})
	ws.SetPingHandler(func(data string) error {
		c.extendLiveness()
		err := ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(c.writeTimeout))
		var ne net.Error
		if err == nil || errors.Is(err, websocket.ErrCloseSent) || errors.As(err, &ne) && ne.Timeout() {
			return nil // as gorilla's default handler: a lost pong is not a read error
		}
		return err
	})
	c.extendLiveness()
	if g.pingInterval > 0 {
		c.startPinging(g.pingInterval)
	}
	if slot, ok := r.Context().Value(acceptedKey{}).(*acceptedSlot); ok {
		slot.conn = c
	}
	return c, nil
}

// gorillaConn is one accepted connection.
//
// Concurrency: gorilla allows one concurrent reader and one concurrent writer, with Close and
// WriteControl safe alongside everything. gqlgen reads from one goroutine at a time (init, then
// the run loop) and already serialises its writes: wsConnection.write and wsConnection.close
// hold wsConnection.mu around Send (WriteJSON) and WriteClose, although subscriptions, the
// keep-alive and the ping tickers write from their own goroutines. writeMu still serialises
// WriteJSON here, uncontended, so that the pair (set write deadline, write) stays atomic
// whoever calls it. WriteClose, pings and pongs are control frames (WriteControl), which carry
// their own deadline. SetReadDeadline is called from gqlgen's ping goroutine while the run loop
// reads, so the deadlines are kept under deadlineMu.
type gorillaConn struct {
	ws           *websocket.Conn
	ctx          context.Context // the upgrade request's: it ends when the server shuts down
	writeTimeout time.Duration
	pongWait     time.Duration
	metrics      *websocketMetrics

	writeMu sync.Mutex
	// wrote: a message went out, so gqlgen either acknowledged the connection (and its read
	// loop, whose end closes the socket, runs) or sent connection_error and closed it.
	wrote atomic.Bool

	// tooBig: the peer sent a message over the read limit, of which the rest is unread.
	tooBig atomic.Bool

	deadlineMu        sync.Mutex
	transportDeadline time.Time // gqlgen's (graphql-transport-ws pong timeout)
	livenessDeadline  time.Time // ours, extended by every pong and message

	once sync.Once
	done chan struct{} // closed when the network connection is closed
	// pingTimer sends the next ping frame; nil when pings are off.
	pingTimer *time.Timer
	err       error
}

var (
	_ transport.WebsocketConn          = (*gorillaConn)(nil)
	_ transport.WebsocketReadLimiter   = (*gorillaConn)(nil)
	_ transport.WebsocketReadDeadliner = (*gorillaConn)(nil)
)

func (c *gorillaConn) Subprotocol() string { return c.ws.Subprotocol() }

// SetReadLimit caps the size of one message from the peer; a larger one gets close code 1009
// and ends the connection.
func (c *gorillaConn) SetReadLimit(limit int64) { c.ws.SetReadLimit(limit) }

// NextReader returns the peer's next message. A normal close by the peer (1000, 1001, or a
// close frame without a code) is transport.ErrWebsocketClosed, which gqlgen does not report as
// an error.
func (c *gorillaConn) NextReader() (int, io.Reader, error) {
	mt, r, err := c.ws.NextReader()
	if err != nil {
		if errors.Is(err, websocket.ErrReadLimit) && !c.tooBig.Swap(true) && c.metrics != nil {
			// gorilla has sent the close frame itself.
			c.metrics.closes.WithLabelValues(strconv.Itoa(websocket.CloseMessageTooBig)).Inc()
		}
		if websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway, websocket.CloseNoStatusReceived) {
			return mt, nil, transport.ErrWebsocketClosed
		}
		return mt, nil, err
	}
	c.extendLiveness()
	return mt, r, nil
}

// WriteJSON writes v as one text message within the write timeout. A failed write leaves the
// connection unusable (gorilla's state is corrupt after a timeout), so it is closed at once,
// which also ends the read loop and with it the connection's subscriptions.
func (c *gorillaConn) WriteJSON(v any) error {
	b, err := json.Marshal(v) // before writing: a failed encoding must not send half a frame
	if err != nil {
		return err
	}
	c.writeMu.Lock()
	c.ws.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	err = c.ws.WriteMessage(websocket.TextMessage, b)
	c.writeMu.Unlock()
	if err != nil {
		if !errors.Is(err, websocket.ErrCloseSent) {
			c.shutdown()
		}
		return err
	}
	c.wrote.Store(true)
	return nil
}

// WriteClose sends a close frame within the write timeout. gqlgen closes with 1000 when the
// request context ends; when that is the server shutting down, the frame says 1001 (going
// away), which is what RFC 6455 gives a server going down and tells clients to reconnect.
func (c *gorillaConn) WriteClose(code int, reason string) error {
	if code == websocket.CloseNormalClosure && c.ctx.Err() != nil {
		code, reason = websocket.CloseGoingAway, "server shutting down"
	}
	err := c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, closeReason(reason)), time.Now().Add(c.writeTimeout))
	if errors.Is(err, websocket.ErrCloseSent) {
		return nil // gorilla already sent one, e.g. 1009 for an oversized message
	}
	if err == nil && c.metrics != nil {
		c.metrics.closes.WithLabelValues(strconv.Itoa(code)).Inc()
	}
	return err
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

// Close closes the network connection; it is safe to call more than once and concurrently.
func (c *gorillaConn) Close() error {
	c.shutdown()
	if errors.Is(c.err, net.ErrClosed) {
		return nil
	}
	return c.err
}

func (c *gorillaConn) shutdown() {
	c.once.Do(func() {
		if c.tooBig.Load() {
			c.drain()
		}
		c.err = c.ws.Close()
		close(c.done)
		if c.pingTimer != nil {
			c.pingTimer.Stop()
		}
		if c.metrics != nil {
			c.metrics.open.Dec()
		}
	})
}

// Bounds of drain.
const (
	drainTimeout = time.Second
	drainBytes   = 4 << 20
)

// drain reads and discards what the peer still sends, until it closes, for up to drainTimeout
// and drainBytes. Closing a TCP connection with unread input resets it, and a reset can destroy
// the close frame (1009) before the peer has read it; after an oversized message, most of it is
// unread. It runs only once the reader has failed (gorilla's read errors are final, and gqlgen
// stops reading at the first), so it never reads alongside another reader.
func (c *gorillaConn) drain() {
	nc := c.ws.NetConn()
	if nc.SetReadDeadline(time.Now().Add(drainTimeout)) == nil {
		io.CopyN(io.Discard, nc, drainBytes)
	}
}

// SetReadDeadline is gqlgen's deadline (graphql-transport-ws: a pong must follow its ping); the
// connection reads until the earlier of it and the liveness deadline.
func (c *gorillaConn) SetReadDeadline(t time.Time) error {
	c.deadlineMu.Lock()
	defer c.deadlineMu.Unlock()
	c.transportDeadline = t
	return c.applyReadDeadlineLocked()
}

// extendLiveness gives the peer another pongWait: called for every pong, ping and message.
func (c *gorillaConn) extendLiveness() {
	if c.pongWait <= 0 {
		return
	}
	c.deadlineMu.Lock()
	defer c.deadlineMu.Unlock()
	c.livenessDeadline = time.Now().Add(c.pongWait)
	c.applyReadDeadlineLocked()
}

func (c *gorillaConn) applyReadDeadlineLocked() error {
	d := c.livenessDeadline
	if t := c.transportDeadline; !t.IsZero() && (d.IsZero() || t.Before(d)) {
		d = t
	}
	return c.ws.SetReadDeadline(d)
}

// startPinging sends a ping frame every interval until the connection closes; a ping that
// cannot be written within the write timeout closes the connection. A timer that runs the
// ping, rather than a goroutine that waits for a ticker, costs an idle connection no stack:
// with thousands of idle subscribers that is kilobytes each.
func (c *gorillaConn) startPinging(interval time.Duration) {
	// Created stopped, so that the callback never runs before c.pingTimer is set.
	c.pingTimer = time.AfterFunc(time.Duration(math.MaxInt64), func() {
		select {
		case <-c.done:
			return
		default:
		}
		err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(c.writeTimeout))
		switch {
		case errors.Is(err, websocket.ErrCloseSent):
		case err != nil:
			c.shutdown()
		default:
			c.pingTimer.Reset(interval)
		}
	})
	c.pingTimer.Reset(interval)
}

// websocketTransport is gqlgen's WebSocket transport with one repair: gqlgen's Do can return
// without closing the socket it accepted (a connection_init whose payload is not a JSON object
// is dropped with neither a close frame nor a Close), which would leave the hijacked
// connection and its ping timer running for as long as the peer cares to keep it. Do closes such a
// socket, and otherwise waits for gqlgen's own close, so that the request (and its context)
// lasts exactly as long as the socket.
type websocketTransport struct {
	transport.Websocket
	limits *connLimits
	// grace bounds the wait for gqlgen's own close once its read loop has ended; its close
	// frame may take up to the write timeout.
	grace time.Duration
}

func (t websocketTransport) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	t.limits.limitSockets(func(w http.ResponseWriter, r *http.Request) { t.serve(w, r, exec) })(w, r)
}

// serve runs one socket, from the handshake to its close.
func (t websocketTransport) serve(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	slot := &acceptedSlot{}
	defer func() {
		if slot.release != nil {
			slot.release()
		}
	}()
	t.Websocket.Do(w, r.WithContext(context.WithValue(r.Context(), acceptedKey{}, slot)), exec)
	c := slot.conn
	if c == nil {
		return
	}
	if !c.wrote.Load() {
		// Nothing was ever sent: every path of gqlgen's that closes has closed by now, and no
		// read loop (whose end would close it) was started.
		select {
		case <-c.done:
		default:
			c.WriteClose(transport.WebsocketCloseProtocolError, "connection initialisation failed")
			c.shutdown()
		}
		return
	}
	timer := time.NewTimer(t.grace)
	defer timer.Stop()
	select {
	case <-c.done:
	case <-timer.C:
		c.shutdown()
	}
}

// websocketInit authenticates a WebSocket connection from its connection_init payload, which
// stands in for the headers a browser cannot set on a WebSocket handshake. The token is read
// from, in this order:
//
//	{"Authorization": "Bearer <token>"}   (the scheme is case-insensitive)
//	{"authorization": "Bearer <token>"}
//	{"authToken": "<token>"}              (a "Bearer " prefix is tolerated)
//
// No token (no payload, none of the keys, or an empty value) closes the connection with 4401
// Unauthorized — unless the handshake itself carried a valid Authorization header, which
// authenticate has checked; a token that is malformed or fails verification (bad signature,
// expired, ...) closes it with 4403 Forbidden. A token in the payload wins over the header. On
// the legacy graphql-ws protocol a connection_error message with the reason comes first.
//
// A principal that already holds as many sockets as it may gets 4429 (too many connections).
func websocketInit(keys *auth.Keys, limits *connLimits, log *slog.Logger) transport.WebsocketInitFunc {
	return func(ctx context.Context, payload transport.InitPayload) (context.Context, *transport.InitPayload, error) {
		token, err := initToken(payload)
		if err != nil {
			return refuse(ctx, log, CloseForbidden, "Forbidden", err)
		}
		p, ok := auth.FromContext(ctx)
		switch {
		case token != "":
			if p, err = keys.Verify(token); err != nil {
				return refuse(ctx, log, CloseForbidden, "Forbidden", err)
			}
			requestInfoFrom(ctx).set(p.Subject, "")
			ctx = auth.WithPrincipal(ctx, p)
		case !ok:
			return refuse(ctx, log, CloseUnauthorized, "Unauthorized", errors.New(`authentication required: send {"Authorization": "Bearer <token>"} in the connection_init payload`))
		}
		release := limits.take(p.Subject, socketsOf, limits.maxPrincipalSockets, limitPrincipalSockets)
		if release == nil {
			return refuse(ctx, log, CloseTooManyConnections, "Too many connections",
				fmt.Errorf("%s holds as many WebSockets as one principal may (%d): close one first", p.Subject, limits.maxPrincipalSockets))
		}
		if slot, ok := ctx.Value(acceptedKey{}).(*acceptedSlot); ok {
			slot.release = release
		} else {
			release()
		}
		ctx = context.WithValue(ctx, socketSubscriptionsKey{}, &socketSubscriptions{})
		return context.WithValue(ctx, socketAuthenticated{}, true), nil, nil
	}
}

// socketAuthenticated marks the context of a WebSocket connection, which authenticates once,
// in connection_init, and may outlive its token; its operations are not HTTP requests that
// the middleware checks one by one.
type socketAuthenticated struct{}

// onSocket reports whether the operation of ctx arrived on a WebSocket.
func onSocket(ctx context.Context) bool { return ctx.Value(socketAuthenticated{}) != nil }

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

// refuse returns what makes gqlgen close the socket with code and reason: it reads both from
// the context an InitFunc returns with its error (transport.WithWebsocketCloseCode,
// transport.AppendCloseReason); the error's text becomes the connection_error message.
func refuse(ctx context.Context, log *slog.Logger, code int, reason string, err error) (context.Context, *transport.InitPayload, error) {
	log.DebugContext(ctx, "websocket refused", "code", code, "err", err)
	ctx = transport.WithWebsocketCloseCode(ctx, code)
	ctx = transport.AppendCloseReason(ctx, reason)
	return ctx, nil, err
}

// initToken returns the bearer token of a connection_init payload, "" for none.
func initToken(p transport.InitPayload) (string, error) {
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
// writeTimeout, so a client that stops reading is dropped and one that reads is kept. Writes
// after the handler returned (gqlgen's SSE keep-alive ticker may still fire) are dropped.
func streamDeadlines(writeTimeout time.Duration, next http.Handler) http.Handler {
	sse := transport.SSE{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "" || !sse.Supports(r) { // gqlgen serves upgrades first
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		// Errors mean the writer has no deadlines (e.g. a test recorder): nothing to lift.
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		dw := &deadlineWriter{ResponseWriter: w, rc: rc, timeout: writeTimeout}
		defer dw.finish()
		next.ServeHTTP(dw, r)
	})
}

var errStreamEnded = errors.New("server: write after the stream's handler returned")

// deadlineWriter sets a write deadline before every write and flush.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration

	mu       sync.Mutex
	finished bool
}

func (w *deadlineWriter) finish() {
	w.mu.Lock()
	w.finished = true
	w.mu.Unlock()
}

func (w *deadlineWriter) WriteHeader(status int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.finished {
		w.ResponseWriter.WriteHeader(status)
	}
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return 0, errStreamEnded
	}
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	return w.ResponseWriter.Write(p)
}

// Flush implements http.Flusher, which gqlgen's SSE transport requires.
func (w *deadlineWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return
	}
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
