package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/computeql/computeql/graph"
	"github.com/computeql/computeql/logline"
)

// requestInfo is what the layers of one request learn about it, for its log line: the
// request id at once, the subject once authenticated, the operation once parsed.
type requestInfo struct {
	id string

	mu        sync.Mutex
	subject   string
	operation string
	// held: the request's line waits for the stream it began (a WebSocket) to end; line
	// writes it then; ended: the stream has ended.
	held, ended bool
	line        func(context.Context)
}

type requestInfoKey struct{}

func requestInfoFrom(ctx context.Context) *requestInfo {
	ri, _ := ctx.Value(requestInfoKey{}).(*requestInfo)
	return ri
}

// hold keeps the request's line from being written when its handler returns, for a stream
// that outlives it (a WebSocket): the returned function writes it, at the stream's end, with
// ctx, the stream's own context, which must carry ri. The held line keeps no context of its
// own: the request's would keep net/http's contexts of the connection and the request for
// as long as the stream lives.
func (ri *requestInfo) hold() (release func(ctx context.Context)) {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	ri.held = true
	return func(ctx context.Context) {
		ri.mu.Lock()
		line := ri.line
		ri.line, ri.ended = nil, true
		ri.mu.Unlock()
		if line != nil {
			line(ctx)
		}
	}
}

func (ri *requestInfo) set(subject, operation string) {
	if ri == nil {
		return
	}
	ri.mu.Lock()
	defer ri.mu.Unlock()
	if subject != "" {
		ri.subject = subject
	}
	if operation != "" {
		ri.operation = operation
	}
}

// requestIDHeader carries a request's id in and out: a proxy's id is kept, so one id follows
// a request through every log, else the server makes one.
const requestIDHeader = "X-Request-Id"

// requestID returns the caller's id when it is short and plain (it goes into logs as is),
// else a new random one.
func requestID(given string) string {
	if len(given) > 0 && len(given) <= 64 {
		plain := true
		for _, c := range []byte(given) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
				plain = false
				break
			}
		}
		if plain {
			return given
		}
	}
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// logRequests writes one line per HTTP request when it ends (for a WebSocket or SSE stream,
// when the stream ends), with its id, status, size, duration, subject and operation; never
// its headers or body, which hold tokens and user data. Probes and scrapes are logged at
// debug level: they come every few seconds and say nothing about users.
func logRequests(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ri := &requestInfo{id: requestID(r.Header.Get(requestIDHeader))}
		w.Header().Set(requestIDHeader, ri.id)
		rw := &recordingWriter{ResponseWriter: w}
		ctx := context.WithValue(r.Context(), requestInfoKey{}, ri)
		next.ServeHTTP(rw, r.WithContext(ctx))
		status := rw.status
		if rw.hijacked {
			status = http.StatusSwitchingProtocols
		} else if status == 0 {
			status = http.StatusOK
		}
		// Only what the line needs: a held line outlives the request, once per subscriber.
		l := requestLine{method: r.Method, path: loggedPath(r.URL.Path), remote: r.RemoteAddr, status: status, bytes: rw.bytes, start: start}
		ri.mu.Lock()
		if ri.held && !ri.ended {
			ri.line = func(ctx context.Context) { l.log(ctx, log, ri) }
			ri.mu.Unlock()
			return
		}
		ri.mu.Unlock()
		l.log(ctx, log, ri)
	})
}

// requestLine is what the log line of a request says besides what requestInfo learnt.
type requestLine struct {
	method, path, remote string
	status               int
	bytes                int64
	start                time.Time
}

func (l requestLine) log(ctx context.Context, log *slog.Logger, ri *requestInfo) {
	level := slog.LevelInfo
	switch l.path {
	case "/healthz", "/readyz", "/metrics":
		level = slog.LevelDebug
	}
	ri.mu.Lock()
	subject, operation := ri.subject, ri.operation
	ri.mu.Unlock()
	logline.Write(ctx, log, level, "request",
		slog.String("method", l.method), slog.String("path", l.path), slog.Int("status", l.status),
		slog.Int64("bytes", l.bytes), slog.Duration("duration", time.Since(l.start)),
		slog.String("subject", subject), slog.String("operation", operation), slog.String("remote", l.remote))
}

// recordingWriter notes the status and size of a response. It passes on flushing (SSE) and
// hijacking (WebSocket), which the transports find by type assertion.
type recordingWriter struct {
	http.ResponseWriter
	status   int
	bytes    int64
	hijacked bool
}

func (w *recordingWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *recordingWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *recordingWriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

func (w *recordingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.hijacked = true
	}
	return c, rw, err
}

func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// withRequestID is a slog handler that adds the request id to every record logged with a
// request's context, so that an error or audit record leads to its request line.
type withRequestID struct{ slog.Handler }

func (h withRequestID) Handle(ctx context.Context, r slog.Record) error {
	if ri := requestInfoFrom(ctx); ri != nil {
		r.AddAttrs(slog.String("request_id", ri.id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h withRequestID) WithAttrs(attrs []slog.Attr) slog.Handler {
	return withRequestID{h.Handler.WithAttrs(attrs)}
}

func (h withRequestID) WithGroup(name string) slog.Handler {
	return withRequestID{h.Handler.WithGroup(name)}
}

// loggedPath is the path as the request log shows it: a console session's token is a
// credential (one a refusal may give back for a retry), so it never reaches the log.
func loggedPath(path string) string {
	if strings.HasPrefix(path, graph.ConsolePath) {
		return graph.ConsolePath + "…"
	}
	return path
}
