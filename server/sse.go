package server

import (
	"io"
	"mime"
	"net/http"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/computeql/computeql/instance"
)

// sseTransport serves GraphQL over Server-Sent Events as graphql-sse's distinct-connections
// mode says: over POST, and over GET with the operation in the query string (query,
// variables, operationName, extensions; queries and subscriptions only), for clients that
// can only GET. Every result is a next event, answered as POST answers (a refusal before
// execution has no data entry), and the stream ends with a complete event that has a data
// line, without which a browser's EventSource never fires it. The token comes in the
// Authorization header either way. keepAlive is how long the stream may be silent before a
// comment keeps proxies from closing it.
type sseTransport struct{ keepAlive time.Duration }

func (sseTransport) Supports(r *http.Request) bool {
	if asksForWebSocket(r) || !prefersEventStream(r.Header.Get("Accept")) {
		return false
	}
	switch r.Method {
	case http.MethodGet:
		return true
	case http.MethodPost:
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		return err == nil && mt == mediaJSON
	}
	return false
}

var sseGetRefused = map[ast.Operation]opRefusal{ast.Mutation: {why: mutationOverGET}}

func (t sseTransport) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	start := graphql.Now()
	var params *graphql.RawParams
	var err error
	var refused map[ast.Operation]opRefusal
	if r.Method == http.MethodGet {
		varyByAccept(w)
		params, err = getParams(r)
		refused = sseGetRefused
	} else {
		params, err = readRequest(r)
	}
	if err != nil {
		writeError(w, r, http.StatusBadRequest, instance.CodeBadUserInput, err.Error())
		return
	}
	exec, oc, errs := operationContext(r, exec, params, start, refused)
	ctx := graphql.WithOperationContext(r.Context(), oc)

	w.Header().Set("Content-Type", mediaEventStream)
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	s := newSSEStream(w, t.keepAlive)
	defer s.close()
	if errs != nil {
		s.next(exec.DispatchError(ctx, errs), false)
	} else {
		responses, ctx := exec.DispatchOperation(ctx, oc)
		for resp := responses(ctx); resp != nil; resp = responses(ctx) {
			s.next(resp, true)
		}
	}
	s.write("event: complete\ndata:\n\n")
}

// sseStream writes one stream's events, each flushed at once, and a keep-alive comment after
// every keepAlive of silence, from a goroutine the stream owns until close.
type sseStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	mu    sync.Mutex
	timer *time.Timer // nil without keep-alives
	every time.Duration

	stop chan struct{}
	done sync.WaitGroup
}

func newSSEStream(w http.ResponseWriter, keepAlive time.Duration) *sseStream {
	s := &sseStream{w: w, rc: http.NewResponseController(w), every: keepAlive, stop: make(chan struct{})}
	// A comment first, so that the client sees the stream open before any event.
	s.write(":\n\n")
	if keepAlive > 0 {
		s.timer = time.NewTimer(keepAlive)
		s.done.Go(s.keepAlive)
	}
	return s
}

func (s *sseStream) keepAlive() {
	for {
		select {
		case <-s.stop:
			return
		case <-s.timer.C:
			s.write(": ping\n\n")
		}
	}
}

// next writes resp as a next event, without its data entry when withData is false.
func (s *sseStream) next(resp *graphql.Response, withData bool) {
	b, err := appendResponse([]byte("event: next\ndata: "), resp, withData)
	if err != nil {
		b, _ = appendResponse([]byte("event: next\ndata: "), &graphql.Response{Errors: gqlerror.List{{
			Message: "the result could not be encoded", Extensions: map[string]any{"code": string(instance.CodeInternal)},
		}}}, false)
	}
	s.write(string(append(b, "\n\n"...)))
}

// write writes and flushes one event or comment, and puts off the next keep-alive. A failed
// write needs no handling here: the client is gone, which ends the request's context and with
// it the subscription.
func (s *sseStream) write(event string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	io.WriteString(s.w, event)
	s.rc.Flush()
	if s.timer != nil {
		s.timer.Reset(s.every)
	}
}

// close stops the keep-alives and waits for their goroutine.
func (s *sseStream) close() {
	close(s.stop)
	s.done.Wait()
	if s.timer != nil {
		s.timer.Stop()
	}
}
