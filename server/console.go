package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/region"
)

// consoleMessageMax caps one message typed into a console: keystrokes and pastes, not files.
const consoleMessageMax = 4 << 10

// consoleHandler serves console sessions at GET /console/{token}: the token, redeemed once,
// attaches the serial console of its instance's server, and the WebSocket carries it both
// ways until the session expires, either end closes, or the server shuts down. The socket
// counts against the process's sockets, and the attachment against the consoles of the
// process and of the principal that opened the session: a console holds a host stream with
// its buffers and two goroutines for as long as it lasts.
type consoleHandler struct {
	svc      *instance.Service
	limits   *connLimits
	upgrader websocket.Upgrader
	log      *slog.Logger
	// lifetime closes every console with 1001 (going away) when it ends.
	lifetime                context.Context
	keepAlive, writeTimeout time.Duration
	open                    prometheus.Gauge
}

func newConsoleHandler(o Options, origins originPolicy, limits *connLimits) (*consoleHandler, error) {
	h := &consoleHandler{
		svc: o.Service, limits: limits, log: o.Logger, lifetime: o.Context,
		keepAlive: o.KeepAliveInterval, writeTimeout: o.StreamWriteTimeout,
		upgrader: websocket.Upgrader{
			HandshakeTimeout: o.StreamWriteTimeout,
			ReadBufferSize:   1024,
			WriteBufferSize:  4096,
			CheckOrigin:      origins.allows,
			Error:            refuseHandshake,
		},
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "computeql_console_sessions",
			Help: "Serial consoles attached through this process.",
		}),
	}
	if err := o.Registry.Register(h.open); err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	return h, nil
}

func (h *consoleHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !websocket.IsWebSocketUpgrade(r) {
		w.Header().Set("Upgrade", "websocket")
		writeError(w, r, http.StatusUpgradeRequired, instance.CodeBadUserInput, "a console session is a WebSocket: open its url with a WebSocket client")
		return
	}
	// A handshake the upgrade would refuse must not use the session first: redeeming it and
	// attaching the console (which takes it from whoever holds it) cannot be undone.
	if r.Header.Get("Sec-Websocket-Version") != "13" || r.Header.Get("Sec-Websocket-Key") == "" {
		w.Header().Set("Sec-WebSocket-Version", "13")
		writeError(w, r, http.StatusBadRequest, instance.CodeBadUserInput, "WebSocket handshake refused: it needs Sec-WebSocket-Version 13 and a Sec-WebSocket-Key")
		return
	}
	if !h.limits.takeSocket() {
		h.limits.refuseSocket(w, r)
		return
	}
	defer h.limits.releaseSocket()
	token := r.PathValue("token")
	grant, err := h.svc.RedeemConsole(r.Context(), token)
	if errors.Is(err, instance.ErrNoConsoleSession) {
		writeError(w, r, http.StatusUnauthorized, instance.CodeUnauthenticated, "the console session is unknown, used or expired: open another with createConsoleSession")
		return
	}
	if err != nil {
		h.refuse(w, r, err)
		return
	}
	requestInfoFrom(r.Context()).set(grant.Principal.Subject, "")
	// Refused for a reason of the moment, the session is given back: its URL works again.
	giveBack := func() {
		// Even when the client has gone already: the session is its to retry.
		if err := h.svc.ReturnConsole(context.WithoutCancel(r.Context()), token, grant); err != nil {
			h.log.WarnContext(r.Context(), "console: return the session", "err", err)
		}
	}
	release, refusal := h.limits.takeConsole(grant.Principal.Subject)
	if release == nil {
		giveBack()
		w.Header().Set("Retry-After", "5")
		writeError(w, r, http.StatusTooManyRequests, instance.CodeRateLimited, refusal)
		return
	}
	defer release()
	attached, err := h.svc.AttachConsole(r.Context(), grant)
	if err != nil {
		if instance.CodeOf(err) == instance.CodeUnavailable {
			giveBack()
		}
		h.refuse(w, r, err)
		return
	}
	ws, err := h.upgrader.Upgrade(w, r, nil)
	if err != nil {
		attached.Console.Close()
		return
	}
	h.open.Inc()
	defer h.open.Dec()
	h.serve(ws, attached)
}

// attachStatus is the HTTP status of a session that cannot be attached, by its error's code;
// any other code is 500.
var attachStatus = map[instance.Code]int{
	instance.CodeNotFound:      http.StatusNotFound,
	instance.CodeForbidden:     http.StatusForbidden,
	instance.CodeUnprocessable: http.StatusConflict,
	instance.CodeConsistency:   http.StatusConflict,
	instance.CodeUnavailable:   http.StatusServiceUnavailable,
}

// refuse answers a session that cannot be attached with its error's code and message.
func (h *consoleHandler) refuse(w http.ResponseWriter, r *http.Request, err error) {
	code := instance.CodeOf(err)
	msg := "internal error"
	var e *instance.Error
	if errors.As(err, &e) && code != instance.CodeInternal {
		msg = e.Message
	} else {
		h.log.ErrorContext(r.Context(), "console: attach", "err", err)
	}
	writeError(w, r, cmp.Or(attachStatus[code], http.StatusInternalServerError), code, msg)
}

// serve carries the console over the socket: this goroutine writes what the guest writes,
// and one reader types what arrives. It returns once both have ended and the console is
// detached.
func (h *consoleHandler) serve(ws *websocket.Conn, att *instance.AttachedConsole) {
	s := &consoleSocket{h: h, ws: ws, console: att.Console}
	ws.SetReadLimit(consoleMessageMax)
	ws.SetPongHandler(func(string) error { s.extendLiveness(); return nil })
	s.extendLiveness()
	expiry := time.AfterFunc(time.Until(att.ExpiresAt), func() {
		s.closeWith(websocket.CloseNormalClosure, "the console session expired")
	})
	defer expiry.Stop()
	stopLifetime := context.AfterFunc(h.lifetime, func() { s.closeWith(websocket.CloseGoingAway, "server shutting down") })
	defer stopLifetime()
	if h.keepAlive > 0 {
		s.mu.Lock()
		s.pinger = time.AfterFunc(h.keepAlive, s.ping)
		s.mu.Unlock()
	}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		s.read()
	}()
	if att.Recent != "" {
		s.write([]byte(att.Recent))
	}
	buf := make([]byte, 4096)
	for {
		n, err := att.Console.Read(buf)
		if n > 0 && !s.write(buf[:n]) {
			break
		}
		if err != nil {
			switch {
			case errors.Is(err, region.ErrConsoleOverrun):
				s.closeWith(websocket.CloseTryAgainLater, "the console wrote faster than this connection took it")
			case errors.Is(err, region.ErrUnavailable):
				s.closeWith(websocket.CloseInternalServerErr, "the region's console stream failed")
			default:
				s.closeWith(websocket.CloseNormalClosure, "the console closed: the server stopped, or another session took its console")
			}
			break
		}
	}
	s.closeWith(websocket.CloseNormalClosure, "")
	<-readerDone
	s.mu.Lock()
	if s.pinger != nil {
		s.pinger.Stop()
	}
	s.mu.Unlock()
	ws.Close()
}

// consoleSocket is one console's WebSocket.
type consoleSocket struct {
	h       *consoleHandler
	ws      *websocket.Conn
	console io.ReadWriteCloser

	mu      sync.Mutex
	closing bool
	pinger  *time.Timer
	closer  sync.Once
}

// read types every message into the console until the peer closes (or sends a message over
// consoleMessageMax, which the socket answers with 1009 itself), goes silent past the
// keep-alive, or the socket is closed. Input is paced to consoleInputRate: what is typed
// travels on the host connection every call of the process shares.
func (s *consoleSocket) read() {
	pace := newInputPace(consoleInputRate, consoleMessageMax)
	for {
		_, msg, err := s.ws.ReadMessage()
		if err != nil {
			s.closeWith(websocket.CloseNormalClosure, "")
			return
		}
		s.extendLiveness()
		time.Sleep(pace.wait(len(msg), time.Now()))
		if _, err := s.console.Write(msg); err != nil {
			s.closeWith(websocket.CloseNormalClosure, "the console closed")
			return
		}
	}
}

// consoleInputRate is how many bytes a second may be typed into one console, beyond a burst
// of one message: far above typing, and a paste of a page takes a moment.
const consoleInputRate = 16 << 10

// inputPace is a token bucket of bytes.
type inputPace struct {
	rate, burst, tokens float64
	last                time.Time
}

func newInputPace(rate, burst int) *inputPace {
	return &inputPace{rate: float64(rate), burst: float64(burst), tokens: float64(burst)}
}

// wait takes n bytes from the bucket at now and returns how long to wait before sending them.
func (p *inputPace) wait(n int, now time.Time) time.Duration {
	if !p.last.IsZero() {
		p.tokens = min(p.burst, p.tokens+now.Sub(p.last).Seconds()*p.rate)
	}
	p.last = now
	p.tokens -= float64(n)
	if p.tokens >= 0 {
		return 0
	}
	return time.Duration(-p.tokens / p.rate * float64(time.Second))
}

// write sends one binary message within the write timeout; false when the socket is gone.
func (s *consoleSocket) write(b []byte) bool {
	s.ws.SetWriteDeadline(time.Now().Add(s.h.writeTimeout))
	if err := s.ws.WriteMessage(websocket.BinaryMessage, b); err != nil {
		s.closeWith(websocket.CloseNormalClosure, "")
		return false
	}
	return true
}

// ping sends a ping frame every keep-alive; a peer that answers nothing for two is dropped by
// the reader's deadline.
func (s *consoleSocket) ping() {
	if s.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(s.h.writeTimeout)) != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closing {
		s.pinger.Reset(s.h.keepAlive)
	}
}

func (s *consoleSocket) extendLiveness() {
	if s.h.keepAlive > 0 {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.closing {
			s.ws.SetReadDeadline(time.Now().Add(2 * s.h.keepAlive))
		}
	}
}

// closeWith ends the session: the close frame (the first caller's), the reader given
// closeGrace for the peer's answering close frame, and the console detached, which ends the
// writer. Every caller detaches, outside the once, so that none waits on another's detach.
func (s *consoleSocket) closeWith(code int, reason string) {
	s.closer.Do(func() {
		s.mu.Lock()
		s.closing = true
		s.mu.Unlock()
		s.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, closeReason(reason)), time.Now().Add(s.h.writeTimeout))
		s.ws.SetReadDeadline(time.Now().Add(closeGrace))
	})
	s.console.Close()
}
