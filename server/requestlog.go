package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// requestInfo is what the layers of one request learn about it, for its log line: the
// request id at once, the subject once authenticated, the operation once parsed.
type requestInfo struct {
	id string

	mu        sync.Mutex
	subject   string
	operation string
}

type requestInfoKey struct{}

func requestInfoFrom(ctx context.Context) *requestInfo {
	ri, _ := ctx.Value(requestInfoKey{}).(*requestInfo)
	return ri
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
		logRequest(ctx, log, r, ri, rw, start)
	})
}

// logRequest writes the line of a request that ended. It is apart from logRequests so that
// the frame of a WebSocket's handler, which lives as long as its connection, stays small:
// every byte of stack there is paid once per subscriber.
func logRequest(ctx context.Context, log *slog.Logger, r *http.Request, ri *requestInfo, rw *recordingWriter, start time.Time) {
	level := slog.LevelInfo
	switch r.URL.Path {
	case "/healthz", "/readyz", "/metrics":
		level = slog.LevelDebug
	}
	ri.mu.Lock()
	subject, operation := ri.subject, ri.operation
	ri.mu.Unlock()
	status := rw.status
	if rw.hijacked {
		status = http.StatusSwitchingProtocols
	} else if status == 0 {
		status = http.StatusOK
	}
	log.LogAttrs(ctx, level, "request",
		slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", status),
		slog.Int64("bytes", rw.bytes), slog.Duration("duration", time.Since(start)),
		slog.String("subject", subject), slog.String("operation", operation), slog.String("remote", r.RemoteAddr))
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
