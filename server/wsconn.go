package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unique"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/errcode"
	"github.com/gorilla/websocket"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/graph"
	"github.com/computeql/computeql/instance"
)

// Close codes of the graphql-transport-ws protocol. The legacy graphql-ws protocol names none;
// where it refuses a connection it gets the same codes, after a connection_error message that
// carries the reason.
const (
	// CloseBadRequest (4400): a message of a type or shape the protocol does not define.
	CloseBadRequest = 4400
	// CloseUnauthorized (4401): connection_init carried no token, or an operation came before
	// the connection was acknowledged.
	CloseUnauthorized = 4401
	// CloseForbidden (4403): connection_init carried a token that is malformed or does not verify.
	CloseForbidden = 4403
	// CloseSubprotocolNotAcceptable (4406): the handshake offered neither subprotocol.
	CloseSubprotocolNotAcceptable = 4406
	// CloseInitTimeout (4408): no connection_init within the initialisation timeout.
	CloseInitTimeout = 4408
	// CloseSubscriberExists (4409): a subscribe reused the id of an operation still running.
	CloseSubscriberExists = 4409
	// CloseTooManyInitRequests (4429): a second connection_init.
	CloseTooManyInitRequests = 4429
	// CloseTooManyConnections (4429, the same code): connection_init names a principal that
	// already holds as many sockets as it may.
	CloseTooManyConnections = 4429
)

// The GraphQL subprotocols, in order of preference: when a client offers both, it gets the
// current one.
var websocketSubprotocols = []string{"graphql-transport-ws", "graphql-ws"}

// Bounds of the drainers: how many at most, and how long one waits for more work. A burst of
// events (one to each of ten subscribers of an instance, a change to each of many instances)
// keeps them busy; a quiet second lets them go.
const (
	drainersMax = 16
	drainerIdle = time.Second
)

// closeGrace is how long a socket the server closes waits for the peer's close frame before
// the connection is dropped: closing TCP with the peer's data unread resets it, and a reset
// can destroy the close frame before the peer has read it.
const closeGrace = time.Second

// wsTransport serves GraphQL over WebSocket: the graphql-transport-ws protocol exactly as the
// graphql-ws library's PROTOCOL.md defines it, and the legacy graphql-ws protocol of
// subscriptions-transport-ws. gqlgen's executor parses, validates and runs the operations;
// this transport owns the sockets.
//
// What an idle subscriber costs is what decides how many one process holds, so: the HTTP
// handler returns once the socket is upgraded (net/http's buffers and the request are freed);
// a socket has a goroutine, its reader, only while the peer's messages are read and handled,
// and waits for the next one in the poller (idlePoller) with none; an operation runs on a
// goroutine of its own only while it is being answered; a subscription's
// events are delivered from the feed by waking it (graph.Delivery), not by a goroutine
// waiting for them; write buffers come from a pool and are held only while a message is
// written; keep-alives are timers.
type wsTransport struct {
	upgrader websocket.Upgrader
	keys     *auth.Keys
	limits   *connLimits
	log      *slog.Logger
	metrics  *websocketMetrics
	// base is the server's lifetime (Options.Context) without its end: the context sockets'
	// operations start from. The lifetime's end closes every socket with 1001 (going away),
	// those in sockets, from one callback (goAway): one per socket would cost each a context
	// of its own. gone: the lifetime has ended.
	base      context.Context
	socketsMu sync.Mutex
	sockets   map[*wsConn]struct{}
	gone      bool
	// initTimeout bounds the wait for connection_init.
	initTimeout time.Duration
	// keepAlive is how often a socket gets a ping frame, and a "ping" (graphql-transport-ws) or
	// "ka" (graphql-ws) message once acknowledged; a peer silent (no message, no pong) for twice
	// as long is dropped. 0 turns both off.
	keepAlive time.Duration
	// writeTimeout bounds every write; a peer that does not take one within it is dropped.
	writeTimeout time.Duration
	// readLimit caps one message from the peer; a larger one closes the socket with 1009.
	readLimit int64
	// poller holds the idle sockets (nil where there is none: their readers wait in reads).
	poller *idlePoller
	// drainers answer woken subscriptions.
	drainers *drainers
}

func newWSTransport(o Options, origins originPolicy, limits *connLimits, m *websocketMetrics) *wsTransport {
	t := &wsTransport{
		upgrader: websocket.Upgrader{
			HandshakeTimeout: o.StreamWriteTimeout,
			// No ReadBufferSize: gorilla reads through the buffer the hijack hands it (see
			// ownReadBuffer). Write buffers come from a pool and are held only while a message is
			// being written, so an idle subscriber holds none.
			WriteBufferSize: 4096,
			WriteBufferPool: &sync.Pool{},
			Subprotocols:    slices.Clone(websocketSubprotocols),
			CheckOrigin:     origins.allows,
			Error:           refuseHandshake,
		},
		keys: o.Keys, limits: limits, log: o.Logger, metrics: m, base: context.WithoutCancel(o.Context),
		initTimeout: o.initTimeout, keepAlive: o.KeepAliveInterval, writeTimeout: o.StreamWriteTimeout,
		readLimit: o.MaxBodyBytes, sockets: map[*wsConn]struct{}{},
	}
	poller, err := newIdlePoller()
	if err != nil {
		o.Logger.Warn("websocket: idle sockets keep a goroutine each", "err", err)
	}
	t.poller = poller
	t.drainers = newDrainers(drainersMax, drainerIdle, o.Context.Done())
	if m != nil {
		m.poller = poller
	}
	context.AfterFunc(o.Context, t.goAway)
	return t
}

// track adds an opened socket to those the server's end closes; false when it has ended.
func (t *wsTransport) track(c *wsConn) bool {
	t.socketsMu.Lock()
	defer t.socketsMu.Unlock()
	if t.gone {
		return false
	}
	t.sockets[c] = struct{}{}
	return true
}

func (t *wsTransport) untrack(c *wsConn) {
	t.socketsMu.Lock()
	defer t.socketsMu.Unlock()
	delete(t.sockets, c)
}

// goAway closes every socket with 1001 (going away) as the server ends, each on a goroutine
// of its own: a peer slow to take the close frame holds up none of the others.
func (t *wsTransport) goAway() {
	t.socketsMu.Lock()
	t.gone = true
	sockets := t.sockets
	t.sockets = nil
	t.socketsMu.Unlock()
	for c := range sockets {
		go c.closeWith(websocket.CloseGoingAway, "server shutting down")
	}
	t.poller.close()
}

// refuseHandshake answers a WebSocket handshake the upgrader refused, with its reason.
func refuseHandshake(w http.ResponseWriter, r *http.Request, status int, reason error) {
	writeError(w, r, status, instance.CodeBadUserInput, "WebSocket handshake refused: "+reason.Error())
}

var _ graphql.Transport = (*wsTransport)(nil)

// Supports takes every request that asks for an upgrade to a WebSocket: one that is not a
// valid handshake is refused here with its reason. An upgrade to anything else (curl --http2
// asks for h2c) is ignored, as RFC 9110 lets a server do, and the request served as sent.
func (t *wsTransport) Supports(r *http.Request) bool { return asksForWebSocket(r) }

// asksForWebSocket reports whether r's Upgrade header lists websocket.
func asksForWebSocket(r *http.Request) bool {
	for _, v := range r.Header.Values("Upgrade") {
		for token := range strings.SplitSeq(v, ",") {
			if proto, _, _ := strings.Cut(strings.TrimSpace(token), "/"); strings.EqualFold(proto, "websocket") {
				return true
			}
		}
	}
	return false
}

// Do upgrades the request and returns, leaving the socket to its reader.
func (t *wsTransport) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	if !t.limits.takeSocket() {
		t.limits.refuseSocket(w, r)
		return
	}
	own := &ownReadBuffer{ResponseWriter: w}
	ws, err := t.upgrader.Upgrade(own, r, nil)
	if err != nil {
		t.limits.releaseSocket()
		return
	}
	c := &wsConn{t: t, ws: ws, exec: refuseOperations{GraphExecutor: exec}, ctx: t.socketContext(r.Context()), legacy: ws.Subprotocol() == "graphql-ws",
		trace: traceHeaders(r.Header), br: own.br}
	if sc, ok := ws.NetConn().(syscall.Conn); ok && own.br != nil {
		c.raw, _ = sc.SyscallConn()
	}
	if ri := requestInfoFrom(r.Context()); ri != nil {
		c.logLine = ri.hold()
	}
	if t.metrics != nil {
		t.metrics.open.Inc()
	}
	ws.SetReadLimit(t.readLimit)
	ws.SetPongHandler(func(string) error { c.extendLiveness(); return nil })
	ws.SetPingHandler(func(data string) error {
		c.extendLiveness()
		err := ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(t.writeTimeout))
		var ne net.Error
		if err == nil || errors.Is(err, websocket.ErrCloseSent) || errors.As(err, &ne) && ne.Timeout() {
			return nil // as gorilla's default handler: a lost pong is not a read error
		}
		return err
	})
	c.extendLiveness()
	if ws.Subprotocol() == "" {
		c.closeWith(CloseSubprotocolNotAcceptable, "Subprotocol not acceptable")
	} else {
		c.mu.Lock()
		c.timer = time.AfterFunc(t.initTimeout, func() { c.closeWith(CloseInitTimeout, "Connection initialisation timeout") })
		c.mu.Unlock()
	}
	if !t.track(c) {
		c.closeWith(websocket.CloseGoingAway, "server shutting down")
	}
	if !t.poller.park(c) {
		go c.read()
	}
}

// socketContext is the context a socket's operations start from: the server's, and of the
// handshake request's only the values they read (the request's log line, the principal of an
// Authorization header, where the caller reached the API). The request's own context would
// keep, for as long as the socket lives, net/http's contexts of the connection and the request
// (both cancelled once the handler has returned) and gqlgen's trace of the handshake.
func (t *wsTransport) socketContext(req context.Context) context.Context {
	ctx := t.base
	if ri := requestInfoFrom(req); ri != nil {
		ctx = context.WithValue(ctx, requestInfoKey{}, ri)
	}
	if p, ok := auth.FromContext(req); ok {
		ctx = auth.WithPrincipal(ctx, p)
	}
	if u, ok := graph.PublicURL(req); ok {
		ctx = graph.WithPublicURL(ctx, u)
	}
	return ctx
}

// traceHeaders keeps the trace context of the handshake for the socket's operations, and
// nothing else of its headers.
func traceHeaders(h http.Header) http.Header {
	var out http.Header
	for _, k := range []string{"Traceparent", "Tracestate"} {
		if v := h.Values(k); len(v) > 0 {
			if out == nil {
				out = http.Header{}
			}
			out[k] = v
		}
	}
	return out
}

// wsConn is one socket.
type wsConn struct {
	t      *wsTransport
	ws     *websocket.Conn
	exec   graphql.GraphExecutor
	legacy bool // graphql-ws rather than graphql-transport-ws
	trace  http.Header
	// ctx is the server's context with the handshake's values (socketContext). It never
	// ends: the socket ends its operations one by one (wakeOps), so that an operation's
	// context, cancelled on its own, registers with no parent (a cancellable parent would
	// keep a map of its children and a channel).
	ctx context.Context
	// logLine writes the socket's request line, once it has ended, logged with ctx.
	logLine func(context.Context)
	// br is the frame reader's buffer, and raw the socket beneath it: while br is empty the
	// reader may park the socket in the poller (raw nil: it cannot, and waits in gorilla with
	// the stack its reading grew). parkedFd is raw's descriptor once parked (guarded by the
	// poller's lock).
	br       *bufio.Reader
	raw      syscall.RawConn
	parkedFd int32
	// liveUntil is the read deadline extendLiveness last set (Unix nanoseconds): a parked
	// socket has no read to enforce it, so the keep-alive unparks one whose deadline is near.
	liveUntil atomic.Int64

	writeMu sync.Mutex

	mu sync.Mutex
	// initReceived: a connection_init came (a second one closes the socket).
	initReceived bool
	// opCtx is the context operations run in, set once the connection is acknowledged.
	opCtx           context.Context
	principalSocket *hold
	subscriptions   socketSubscriptions
	ops             wsOps
	// started and settled count operations started and those first answered: the reader
	// waits on inFlight (made when it first waits) while maxInFlight are in between.
	started, settled uint64
	inFlight         *sync.Cond
	closing          bool
	// closed mirrors closing for the reader's checks, which must not wait for mu.
	closed atomic.Bool
	// timer waits for connection_init, then sends the keep-alives at nextPing (only it reads
	// and writes nextPing) and wakes the subscriptions at deadline, the token's (zero for
	// none; set with the acknowledgement), after which deadlinePassed is set.
	timer          *time.Timer
	nextPing       time.Time
	deadline       time.Time
	deadlinePassed atomic.Bool

	shutdownOnce sync.Once
}

// read is the socket's reader: it reads and handles the peer's messages and, once no byte of
// another is buffered, parks the socket in the poller and ends; the poller starts the next
// reader when the socket is readable. An idle socket so costs no goroutine and no stack (a
// goroutine blocked in a read keeps the stack its handling of messages grew, since the
// runtime shrinks only stacks less than a quarter used). There is one reader at a time; the
// last releases everything the socket held when the socket ends.
func (c *wsConn) read() {
	for {
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			if errors.Is(err, websocket.ErrReadLimit) {
				// gorilla has sent the close frame (1009) itself; most of the message is unread.
				c.countClose(websocket.CloseMessageTooBig)
				c.drain()
			}
			c.shutdown()
			return
		}
		if c.closed.Load() {
			continue // waiting for the peer's close frame
		}
		c.extendLiveness()
		if c.legacy {
			c.handleLegacy(data)
		} else {
			c.handle(data)
		}
		if c.br != nil && c.br.Buffered() == 0 && c.t.poller.park(c) {
			return
		}
	}
}

// Bounds of drain.
const (
	drainTimeout = time.Second
	drainBytes   = 4 << 20
)

// drain reads and discards what the peer still sends, until it closes, for up to drainTimeout
// and drainBytes, so that the close frame already sent is not destroyed by a reset.
func (c *wsConn) drain() {
	nc := c.ws.NetConn()
	if nc.SetReadDeadline(time.Now().Add(drainTimeout)) == nil {
		io.CopyN(io.Discard, nc, drainBytes)
	}
}

// clientMessage is a message of either protocol, its fields still raw: their types are checked
// one by one, as the protocol requires.
type clientMessage struct {
	typ     string
	id      json.RawMessage
	payload json.RawMessage
}

// parseMessage reads a message's envelope: a JSON object whose "type" is a string. Keys are
// matched exactly (encoding/json alone would also take "Type").
func parseMessage(data []byte) (clientMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil || fields == nil {
		return clientMessage{}, errors.New("Invalid message received: not a JSON object")
	}
	var m clientMessage
	if err := json.Unmarshal(fields["type"], &m.typ); err != nil || m.typ == "" {
		return clientMessage{}, errors.New(`Invalid message received: "type" must be a string`)
	}
	m.id, m.payload = fields["id"], fields["payload"]
	return m, nil
}

// idOf returns the message's id: a non-empty string.
func (m clientMessage) idOf() (string, error) {
	var id string
	if err := json.Unmarshal(m.id, &id); err != nil || id == "" {
		return "", fmt.Errorf(`Invalid message received: %q requires a non-empty string "id"`, m.typ)
	}
	if len(id) > maxOperationID {
		return "", fmt.Errorf(`Invalid message received: an "id" is at most %d bytes`, maxOperationID)
	}
	return id, nil
}

// maxOperationID bounds an operation's id, which the server keeps while the operation runs
// and repeats in every message of it.
const maxOperationID = 128

// maxInFlight bounds the operations of one socket being started or answered at once; the
// reader waits for a place before it reads on, so a client that floods a socket with
// operations (and perhaps reads none of their answers) is held back by its own socket rather
// than costing the server a goroutine per message. An idle subscription holds no place.
const maxInFlight = 16

// isAbsent reports whether a raw field is missing or null.
func isAbsent(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// objectOrAbsent decodes a payload that may be missing or null, and must otherwise be an object.
func objectOrAbsent(raw json.RawMessage) (map[string]any, bool) {
	if isAbsent(raw) {
		return nil, true
	}
	var obj map[string]any
	if err := decodeNumbers(raw, &obj); err != nil {
		return nil, false
	}
	return obj, true
}

// decodeNumbers decodes JSON keeping numbers as json.Number, as gqlgen's transports do, so
// that variables keep their precision until the schema coerces them.
func decodeNumbers(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return dec.Decode(v)
}

// handle serves one message of graphql-transport-ws.
func (c *wsConn) handle(data []byte) {
	m, err := parseMessage(data)
	if err != nil {
		c.closeWith(CloseBadRequest, err.Error())
		return
	}
	switch m.typ {
	case "connection_init":
		payload, ok := objectOrAbsent(m.payload)
		if !ok {
			c.closeWith(CloseBadRequest, `Invalid message received: the "payload" of connection_init must be an object`)
			return
		}
		c.init(payload)
	case "ping":
		payload, ok := objectOrAbsent(m.payload)
		if !ok {
			c.closeWith(CloseBadRequest, `Invalid message received: the "payload" of ping must be an object`)
			return
		}
		pong := map[string]any{"type": "pong"}
		if payload != nil {
			pong["payload"] = payload
		}
		c.write(pong)
	case "pong":
		if _, ok := objectOrAbsent(m.payload); !ok {
			c.closeWith(CloseBadRequest, `Invalid message received: the "payload" of pong must be an object`)
		}
	case "subscribe":
		id, err := m.idOf()
		if err != nil {
			c.closeWith(CloseBadRequest, err.Error())
			return
		}
		params, err := operationParams(m.payload)
		if err != nil {
			c.closeWith(CloseBadRequest, err.Error())
			return
		}
		c.mu.Lock()
		opCtx, cur := c.opCtx, c.ops.get(id)
		exists := cur != nil && !cur.finishing
		if cur != nil && cur.finishing {
			cur.silent.Store(true) // ending anyway: its last word must not reach the new one
		}
		c.mu.Unlock()
		switch {
		case opCtx == nil:
			c.closeWith(CloseUnauthorized, "Unauthorized")
		case exists:
			c.closeWith(CloseSubscriberExists, closeReason("Subscriber for "+id+" already exists"))
		default:
			c.start(opCtx, id, params)
		}
	case "complete":
		id, err := m.idOf()
		if err != nil {
			c.closeWith(CloseBadRequest, err.Error())
			return
		}
		c.stop(id, false)
	default:
		c.closeWith(CloseBadRequest, closeReason("Invalid message received: unexpected type "+strconv.Quote(m.typ)))
	}
}

// handleLegacy serves one message of the legacy graphql-ws protocol, as its reference server
// (subscriptions-transport-ws) does: a message it cannot read gets a connection_error, one of
// an unknown type an error, and the socket stays open.
func (c *wsConn) handleLegacy(data []byte) {
	m, err := parseMessage(data)
	if err != nil {
		c.write(map[string]any{"type": "connection_error", "payload": map[string]any{"message": err.Error()}})
		return
	}
	switch m.typ {
	case "connection_init":
		payload, ok := objectOrAbsent(m.payload)
		if !ok {
			c.refuse(CloseBadRequest, "Bad request", errors.New("connection_init: the payload must be an object"))
			return
		}
		c.init(payload)
	case "start":
		id, err := m.idOf()
		if err != nil {
			c.write(map[string]any{"type": "error", "payload": map[string]any{"message": err.Error()}})
			return
		}
		params, err := operationParams(m.payload)
		if err != nil {
			c.write(map[string]any{"type": "error", "id": id, "payload": map[string]any{"message": err.Error()}})
			return
		}
		c.mu.Lock()
		opCtx := c.opCtx
		c.mu.Unlock()
		if opCtx == nil {
			c.refuse(CloseUnauthorized, "Unauthorized", errors.New("start before the connection was acknowledged: send connection_init first"))
			return
		}
		// A start that reuses a running operation's id replaces it, as the reference server does.
		c.stop(id, false)
		c.start(opCtx, id, params)
	case "stop":
		if id, err := m.idOf(); err == nil {
			c.stop(id, true)
		}
	case "connection_terminate":
		c.closeWith(websocket.CloseNormalClosure, "")
	default:
		msg := map[string]any{"type": "error", "payload": map[string]any{"message": "Invalid message type " + strconv.Quote(m.typ)}}
		if id, err := m.idOf(); err == nil {
			msg["id"] = id
		}
		c.write(msg)
	}
}

// operationParams reads a subscribe (start) payload: an object with a string "query" and
// optional "operationName" (a string), "variables" and "extensions" (objects).
func operationParams(raw json.RawMessage) (*graphql.RawParams, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, errors.New(`Invalid message received: the "payload" must be an object with a "query"`)
	}
	p := &graphql.RawParams{}
	if err := json.Unmarshal(fields["query"], &p.Query); err != nil || isAbsent(fields["query"]) {
		return nil, errors.New(`Invalid message received: "payload.query" must be a string`)
	}
	// A subscription's operation keeps its document's text as long as it runs, and a client's
	// subscribers send the same document: they share a copy, unique's (a new one only after a
	// collection found no handle left to the last).
	p.Query = unique.Make(p.Query).Value()
	if raw := fields["operationName"]; !isAbsent(raw) {
		if err := json.Unmarshal(raw, &p.OperationName); err != nil {
			return nil, errors.New(`Invalid message received: "payload.operationName" must be a string`)
		}
	}
	var ok bool
	if p.Variables, ok = objectOrAbsent(fields["variables"]); !ok {
		return nil, errors.New(`Invalid message received: "payload.variables" must be an object`)
	}
	if p.Extensions, ok = objectOrAbsent(fields["extensions"]); !ok {
		return nil, errors.New(`Invalid message received: "payload.extensions" must be an object`)
	}
	return p, nil
}

// init authenticates the connection from its connection_init payload, which stands in for the
// headers a browser cannot set on a WebSocket handshake. The token is read from, in this order:
//
//	{"Authorization": "Bearer <token>"}   (the scheme is case-insensitive)
//	{"authorization": "Bearer <token>"}
//	{"authToken": "<token>"}              (a "Bearer " prefix is tolerated)
//
// No token (no payload, none of the keys, or an empty value) closes the socket with 4401
// Unauthorized, unless the handshake itself carried a valid Authorization header, which
// authenticate has checked; a token that is malformed or fails verification closes it with
// 4403 Forbidden. A token in the payload wins over the header. A principal that already holds
// as many sockets as it may gets 4429.
func (c *wsConn) init(payload map[string]any) {
	c.mu.Lock()
	again := c.initReceived
	c.initReceived = true
	c.mu.Unlock()
	if again {
		c.closeWith(CloseTooManyInitRequests, "Too many initialisation requests")
		return
	}
	ctx := c.ctx
	token, err := initToken(payload)
	if err != nil {
		c.refuse(CloseForbidden, "Forbidden", err)
		return
	}
	p, ok := auth.FromContext(ctx)
	switch {
	case token != "":
		if p, err = c.t.keys.Verify(token); err != nil {
			c.refuse(CloseForbidden, "Forbidden", err)
			return
		}
		requestInfoFrom(ctx).set(p.Subject, "")
		ctx = auth.WithPrincipal(ctx, p)
	case !ok:
		c.refuse(CloseUnauthorized, "Unauthorized", errors.New(`authentication required: send {"Authorization": "Bearer <token>"} in the connection_init payload`))
		return
	}
	held := c.t.limits.take(p.Subject, socketsOf, c.t.limits.maxPrincipalSockets, limitPrincipalSockets)
	if held == nil {
		c.refuse(CloseTooManyConnections, "Too many connections",
			fmt.Errorf("%s holds as many WebSockets as one principal may (%d): close one first", p.Subject, c.t.limits.maxPrincipalSockets))
		return
	}
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		held.release()
		return
	}
	c.opCtx, c.principalSocket, c.deadline = ctx, held, p.Deadline
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
	c.write(map[string]any{"type": "connection_ack"})
	if c.legacy {
		c.write(map[string]any{"type": "ka"})
	}
	c.startKeepAlive()
}

// refuse ends a connection that may not proceed: on graphql-ws a connection_error with the
// reason comes first.
func (c *wsConn) refuse(code int, reason string, err error) {
	c.t.log.DebugContext(c.ctx, "websocket refused", "code", code, "err", err)
	if c.legacy {
		c.write(map[string]any{"type": "connection_error", "payload": map[string]any{"message": err.Error()}})
	}
	c.closeWith(code, reason)
}

// startKeepAlive starts the socket's one timer, once the connection is acknowledged: every
// keepAlive it sends a ping frame and the protocol's own keep-alive message, and at the
// deadline of the socket's token it wakes the socket's subscriptions, which then end (see
// graph.WithDelivery): one timer per socket rather than one per subscription. A timer, rather
// than a goroutine that waits for a ticker, costs an idle socket no stack.
func (c *wsConn) startKeepAlive() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing || c.t.keepAlive <= 0 && c.deadline.IsZero() {
		return
	}
	if c.t.keepAlive > 0 {
		c.nextPing = time.Now().Add(c.t.keepAlive)
	}
	// Created stopped, so that the callback never runs before c.timer is set.
	c.timer = time.AfterFunc(time.Duration(math.MaxInt64), c.tick)
	c.resetTimerLocked(time.Now())
}

// tick runs what is due of the socket's timer: the wake-up at its token's deadline, the
// keep-alive.
func (c *wsConn) tick() {
	now := time.Now()
	if !c.deadline.IsZero() && !now.Before(c.deadline) && !c.deadlinePassed.Swap(true) {
		c.wakeOps(false)
	}
	if c.t.keepAlive > 0 && !now.Before(c.nextPing) {
		c.nextPing = now.Add(c.t.keepAlive)
		if !c.keepAlive(now) {
			return
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closing {
		c.resetTimerLocked(now)
	}
}

// resetTimerLocked sets the timer to the next of its duties. c.mu must be held.
func (c *wsConn) resetTimerLocked(now time.Time) {
	var next time.Time
	if c.t.keepAlive > 0 {
		next = c.nextPing
	}
	if !c.deadline.IsZero() && !c.deadlinePassed.Load() && (next.IsZero() || c.deadline.Before(next)) {
		next = c.deadline
	}
	if !next.IsZero() {
		c.timer.Reset(next.Sub(now))
	}
}

// keepAlive sends the ping frame and the keep-alive message; false when the socket is gone.
func (c *wsConn) keepAlive(now time.Time) bool {
	if c.liveUntil.Load() < now.Add(c.t.keepAlive).UnixNano() {
		c.t.poller.unpark(c) // the peer's time is up before the next keep-alive
	}
	if err := c.ws.WriteControl(websocket.PingMessage, nil, now.Add(c.t.writeTimeout)); err != nil {
		if !errors.Is(err, websocket.ErrCloseSent) {
			c.drop()
		}
		return false
	}
	keepAlive := "ping"
	if c.legacy {
		keepAlive = "ka"
	}
	return c.write(map[string]any{"type": keepAlive})
}

// extendLiveness gives the peer another two keep-alive intervals: called for every message,
// pong and ping. It runs in the reader, or in the reader's control-frame handlers.
func (c *wsConn) extendLiveness() {
	if c.t.keepAlive > 0 && !c.closed.Load() {
		until := time.Now().Add(2 * c.t.keepAlive)
		c.liveUntil.Store(until.UnixNano())
		c.ws.SetReadDeadline(until)
		if c.closed.Load() {
			// closeWith ran meanwhile, on another goroutine: its grace stands.
			c.ws.SetReadDeadline(time.Now().Add(closeGrace))
		}
	}
}

// write sends one message within the write timeout; false when the socket is gone. A failed
// write leaves the connection unusable (gorilla's state is corrupt after a timeout), so it is
// closed at once, which ends the reader and with it the socket.
func (c *wsConn) write(v any) bool { return c.writeUnless(nil, v) }

// writeUnless is write, unless skip (when not nil) is set once the write lock is held: a
// message of an operation the client stopped never follows what stop sent.
func (c *wsConn) writeUnless(skip *atomic.Bool, v any) bool {
	b, err := json.Marshal(v) // before writing: a failed encoding must not send half a frame
	if err != nil {
		c.t.log.ErrorContext(c.ctx, "websocket: encode message", "err", err)
		return false
	}
	return c.send(b, skip)
}

// send writes one encoded message, unless skip (when not nil) is set once the lock is held.
func (c *wsConn) send(b []byte, skip *atomic.Bool) bool {
	c.writeMu.Lock()
	if skip != nil && skip.Load() {
		c.writeMu.Unlock()
		return false
	}
	c.ws.SetWriteDeadline(time.Now().Add(c.t.writeTimeout))
	err := c.ws.WriteMessage(websocket.TextMessage, b)
	c.writeMu.Unlock()
	if err != nil {
		if !errors.Is(err, websocket.ErrCloseSent) {
			c.drop()
		}
		return false
	}
	return true
}

// closeWith sends a close frame with the code and reason, ends every operation, and gives the
// peer closeGrace to answer with its own before the reader drops the connection. Any
// goroutine may call it; only the first call does anything.
func (c *wsConn) closeWith(code int, reason string) {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	c.markClosingLocked()
	c.mu.Unlock()
	// The close frame goes first: after it no message can be written, so an operation that
	// ends with the socket never sends its complete ahead of the close.
	err := c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, closeReason(reason)), time.Now().Add(c.t.writeTimeout))
	c.wakeOps(true)
	switch {
	case errors.Is(err, websocket.ErrCloseSent):
	case err != nil:
		c.drop()
	default:
		c.countClose(code)
		c.ws.SetReadDeadline(time.Now().Add(closeGrace))
		c.t.poller.unpark(c) // its reader enforces the grace
	}
}

// drop closes the connection at once. A parked socket is unparked first, while its descriptor
// is still open, so that a reader sees the end and releases what the socket held.
func (c *wsConn) drop() {
	c.closed.Store(true)
	c.t.poller.unpark(c)
	c.ws.Close()
}

// markClosingLocked notes that the socket is closing: no timer fires any more, and a reader
// waiting for a place among the operations in flight stops waiting. c.mu must be held.
func (c *wsConn) markClosingLocked() {
	c.closing = true
	c.closed.Store(true)
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.inFlight != nil {
		c.inFlight.Broadcast()
	}
}

func (c *wsConn) countClose(code int) {
	if c.t.metrics != nil {
		c.t.metrics.closes.WithLabelValues(strconv.Itoa(code)).Inc()
	}
}

// wakeOps wakes every operation of the socket, since an idle subscription has no goroutine
// to notice anything by itself: at its token's deadline, which a subscription looks at when
// woken, and, with end, as the socket closes, cancelling each one's context first so that it
// ends and gives back its place in the feed. An operation no longer in c.ops has been
// cancelled already.
func (c *wsConn) wakeOps(end bool) {
	c.mu.Lock()
	ops := slices.Clone(c.ops)
	c.mu.Unlock()
	for _, op := range ops {
		if end {
			op.abort()
		}
		op.wake()
	}
}

// shutdown releases what the socket held; the reader calls it when it ends.
func (c *wsConn) shutdown() {
	c.shutdownOnce.Do(func() {
		c.mu.Lock()
		c.markClosingLocked()
		held := c.principalSocket
		c.mu.Unlock()
		c.wakeOps(true)
		c.t.untrack(c)
		c.ws.Close()
		if held != nil {
			held.release()
		}
		c.t.limits.releaseSocket()
		if c.t.metrics != nil {
			c.t.metrics.open.Dec()
		}
		if c.logLine != nil {
			c.logLine(c.ctx)
		}
	})
}

// wsOp is one operation running on a socket.
type wsOp struct {
	c      *wsConn
	id     string
	ctx    context.Context
	cancel context.CancelFunc
	// silent: the client stopped the operation (or another took its id): nothing more is sent
	// for it. lastSent: the message that ends it went out (or is going).
	silent, lastSent atomic.Bool
	// finishing: the operation is ending; its id is taken until its last message is out.
	// Guarded by c.mu.
	finishing bool
	// onEnd runs when the operation ends (see whenEnded), and ended says it has. Guarded by
	// c.mu.
	onEnd func()
	ended bool

	handler      graphql.ResponseHandler
	delivery     *graph.Delivery
	subscription bool
	answered     bool // a response was sent
	// running: a goroutine is answering the operation; dirty: it was woken meanwhile.
	running, dirty atomic.Bool
}

// start runs an operation on a goroutine of its own, which ends once the operation has
// answered everything that is ready: a subscription then waits for its events without one.
func (c *wsConn) start(opCtx context.Context, id string, params *graphql.RawParams) {
	op := &wsOp{c: c, id: id}
	ctx, cancel := context.WithCancel(context.WithValue(opCtx, wsOpKey{}, op))
	op.ctx, op.cancel = ctx, cancel
	op.running.Store(true) // the goroutine below answers first; wakes meanwhile are noted
	c.mu.Lock()
	for c.started-c.settled >= maxInFlight && !c.closing {
		if c.inFlight == nil {
			c.inFlight = sync.NewCond(&c.mu)
		}
		c.inFlight.Wait()
	}
	if c.closing {
		c.mu.Unlock()
		cancel()
		return
	}
	c.started++
	c.ops.put(op)
	c.mu.Unlock()
	params.ReadTime = graphql.TraceTiming{Start: graphql.Now(), End: graphql.Now()}
	params.Headers = c.trace
	go op.run(params)
}

// settle gives back the place an operation held while it was started and first answered.
func (c *wsConn) settle() {
	c.mu.Lock()
	c.settled++
	if c.inFlight != nil {
		c.inFlight.Signal()
	}
	c.mu.Unlock()
}

func (op *wsOp) run(params *graphql.RawParams) {
	c := op.c
	defer c.settle()
	ctx := graphql.StartOperationTrace(op.ctx)
	rc, errs := c.exec.CreateOperationContext(ctx, params)
	if errs != nil {
		resp := c.exec.DispatchError(graphql.WithOperationContext(ctx, rc), errs)
		if errcode.GetErrorKind(errs) == errcode.KindProtocol {
			resp = &graphql.Response{Errors: resp.Errors}
		}
		op.fail(resp)
		return
	}
	op.subscription = rc.Operation != nil && rc.Operation.Operation == ast.Subscription
	// DispatchOperation puts rc in the context itself.
	ctx, op.delivery = graph.WithDelivery(ctx, op.wake)
	op.handler, ctx = c.exec.DispatchOperation(ctx, rc)
	op.ctx = ctx
	if op.delivery.Attached() {
		op.drain()
		return
	}
	// Refused, or not a subscription: its responses come at once.
	for op.respond(op.handler(op.ctx)) {
	}
}

// wsOps are a socket's operations, one per id. A slice, searched: a socket runs few (at most
// MaxSubscriptionsPerSocket and maxInFlight more), and most sockets one, which a map would
// cost a table of its own.
type wsOps []*wsOp

// get returns the operation of the id, or nil.
func (ops wsOps) get(id string) *wsOp {
	for _, op := range ops {
		if op.id == id {
			return op
		}
	}
	return nil
}

// put adds the operation, in the place of one of the same id (ending).
func (ops *wsOps) put(op *wsOp) {
	for i, cur := range *ops {
		if cur.id == op.id {
			(*ops)[i] = op
			return
		}
	}
	*ops = append(*ops, op)
}

// remove removes the operation, if it is there.
func (ops *wsOps) remove(op *wsOp) {
	if i := slices.Index(*ops, op); i >= 0 {
		last := len(*ops) - 1
		(*ops)[i] = (*ops)[last]
		(*ops)[last] = nil
		*ops = (*ops)[:last]
	}
}

// wsOpKey holds, in an operation's context, the *wsOp it runs as.
type wsOpKey struct{}

// whenEnded runs f once the operation of ctx has ended, however it ends: at once if it has
// already. A WebSocket operation keeps f in a field, run as its context is cancelled: a
// context callback would cost each idle subscription a context of its own, a done channel and
// a map of children.
func whenEnded(ctx context.Context, f func()) {
	op, ok := ctx.Value(wsOpKey{}).(*wsOp)
	if !ok {
		context.AfterFunc(ctx, f)
		return
	}
	op.c.mu.Lock()
	if !op.ended {
		if prev := op.onEnd; prev != nil {
			next := f
			f = func() { prev(); next() }
		}
		op.onEnd = f
		op.c.mu.Unlock()
		return
	}
	op.c.mu.Unlock()
	f()
}

// abort cancels the operation's context and runs what waits for its end, once. c.mu must not
// be held.
func (op *wsOp) abort() {
	op.cancel()
	op.c.mu.Lock()
	f := op.onEnd
	op.onEnd, op.ended = nil, true
	op.c.mu.Unlock()
	if f != nil {
		f()
	}
}

// wake is the subscription's signal that its next event may be ready: it starts a goroutine
// to answer it, unless one is answering already (which then looks again).
func (op *wsOp) wake() {
	op.dirty.Store(true)
	if op.running.CompareAndSwap(false, true) {
		op.c.t.drainers.run(op.drain)
	}
}

// drain answers every response of the subscription that is ready, then returns.
func (op *wsOp) drain() {
	for {
		op.dirty.Store(false)
		for op.delivery.Next() {
			if !op.respond(op.handler(op.ctx)) {
				return // over: running stays set, so that no wake starts another
			}
		}
		op.running.Store(false)
		// A wake between the last Next and the store above found running set and left: look
		// again, unless another wake has started a goroutine since.
		if !op.dirty.Load() || !op.running.CompareAndSwap(false, true) {
			return
		}
	}
}

// respond sends one response; false once the operation is over (resp nil, or refused).
func (op *wsOp) respond(resp *graphql.Response) bool {
	if resp == nil {
		op.finish(true)
		return false
	}
	if !op.answered && op.subscription && resp.Data == nil && len(resp.Errors) > 0 {
		// A subscription refused before its first event (not found, rate limited…).
		op.fail(resp)
		return false
	}
	if op.ctx.Err() != nil {
		op.finish(true)
		return false
	}
	op.answered = true
	typ := "next"
	if op.c.legacy {
		typ = "data"
	}
	if !op.c.writeUnless(&op.silent, wsResult{ID: op.id, Type: typ, Payload: resp}) {
		op.finish(false)
		return false
	}
	return true
}

// wsResult is a next (graphql-transport-ws) or data (graphql-ws) message.
type wsResult struct {
	ID      string            `json:"id"`
	Type    string            `json:"type"`
	Payload *graphql.Response `json:"payload"`
}

// wsErrors is an error message of graphql-transport-ws: its payload is the list of errors.
type wsErrors struct {
	ID      string        `json:"id"`
	Type    string        `json:"type"`
	Payload gqlerror.List `json:"payload"`
}

// fail answers an operation refused before it ran: on graphql-transport-ws with an error
// message, which ends it (no complete follows); on graphql-ws, whose clients expect errors as
// a result, with data and complete.
func (op *wsOp) fail(resp *graphql.Response) {
	if op.c.legacy {
		op.answered = true
		op.c.writeUnless(&op.silent, wsResult{ID: op.id, Type: "data", Payload: resp})
		op.finish(true)
		return
	}
	op.end(wsErrors{ID: op.id, Type: "error", Payload: resp.Errors}, true)
}

// finish ends the operation; with complete, it tells the client so: on graphql-ws always
// once (after a stop too), on graphql-transport-ws unless the client completed it first.
func (op *wsOp) finish(complete bool) {
	if !complete {
		op.end(nil, false)
		return
	}
	op.end(map[string]any{"type": "complete", "id": op.id}, !op.c.legacy)
}

// end ends the operation with its last message (nil: none), sent once, and unless gated
// while the client stopped it. The operation stays in the socket's table, marked finishing,
// until that message is out: a stop of its id meanwhile finds it and silences it, so the
// client never hears of it after it let the id go (and perhaps reused it).
func (op *wsOp) end(last any, gated bool) {
	c := op.c
	c.mu.Lock()
	op.finishing = true
	c.mu.Unlock()
	op.abort()
	if op.delivery != nil {
		op.delivery.Stop()
	}
	if last != nil && op.lastSent.CompareAndSwap(false, true) {
		if gated {
			c.writeUnless(&op.silent, last)
		} else {
			c.write(last)
		}
	}
	c.mu.Lock()
	c.ops.remove(op)
	c.mu.Unlock()
}

// stop ends the operation the client completed (stopped), or replaced with a start of the same
// id. Its id is free at once, as the client may reuse it as soon as it has sent the message,
// and nothing more of the operation is sent, but for a graphql-ws stop (complete) the
// complete that protocol answers with, once.
func (c *wsConn) stop(id string, complete bool) {
	c.mu.Lock()
	op := c.ops.get(id)
	if op != nil {
		op.silent.Store(true) // under c.mu: end either sees it or has not yet looked
		c.ops.remove(op)
	}
	c.mu.Unlock()
	if op == nil {
		return
	}
	op.abort()
	switch {
	case !complete:
		op.lastSent.Store(true) // replaced, or completed by the client: no last word at all
	case op.lastSent.CompareAndSwap(false, true):
		c.write(map[string]any{"type": "complete", "id": id})
	}
	// An idle subscription has no goroutine to notice its end: wake it. (An operation still
	// starting, or answering once, holds running: it notices by itself.)
	op.wake()
}
