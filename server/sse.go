package server

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/gorilla/websocket"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/computeql/computeql/instance"
)

// sseTransport is gqlgen's Server-Sent Events transport as graphql-sse's distinct-connections
// mode says: over POST, and over GET with the operation in the query string (query,
// variables, operationName, extensions; queries and subscriptions only), for clients that
// can only GET; and with a data line on the complete event, without which a browser's
// EventSource never fires it. The token comes in the Authorization header either way.
type sseTransport struct{ transport.SSE }

func (t sseTransport) Supports(r *http.Request) bool {
	if websocket.IsWebSocketUpgrade(r) || !prefersEventStream(r.Header.Get("Accept")) {
		return false
	}
	return r.Method == http.MethodGet || t.SSE.Supports(r)
}

// prefersEventStream reports whether an Accept header prefers an event stream to every JSON
// answer it also accepts: the highest q wins, the earlier at equal q. A client that lists the
// event stream after JSON (urql lists every type it can read) gets JSON.
func prefersEventStream(accept string) bool {
	best, bestQ := "", 0.0
	for part := range strings.SplitSeq(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch mt {
		case "text/event-stream", mediaJSON, mediaGraphQLResponse:
		default:
			continue
		}
		q := 1.0
		if v, ok := params["q"]; ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				q = f
			}
		}
		if q > bestQ {
			best, bestQ = mt, q
		}
	}
	return best == "text/event-stream"
}

func (t sseTransport) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	if r.Method == http.MethodGet {
		post, err := asPost(r)
		if err != nil {
			writeError(w, r, http.StatusBadRequest, instance.CodeBadUserInput, err.Error())
			return
		}
		r = post
		exec = refuseOperations{exec, map[ast.Operation]string{
			ast.Mutation: "mutations change state and are sent with POST, never GET (which caches and crawlers may repeat)",
		}}
	} else {
		// gqlgen's transport decodes the body again; a body it cannot take is refused here,
		// with a code, as the POST transport refuses it.
		body, err := io.ReadAll(r.Body) // bounded by limitBody
		if err != nil {
			writeError(w, r, http.StatusBadRequest, instance.CodeBadUserInput, "could not read the request body")
			return
		}
		if _, err := decodeRequest(body); err != nil {
			writeError(w, r, http.StatusBadRequest, instance.CodeBadUserInput, err.Error())
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	t.SSE.Do(completeWithData{w}, r, exec)
}

// asPost returns the GET request with its operation as a POST's JSON body, which is what the
// transport reads.
func asPost(r *http.Request) (*http.Request, error) {
	q := r.URL.Query()
	body := map[string]any{"query": q.Get("query")}
	if op := q.Get("operationName"); op != "" {
		body["operationName"] = op
	}
	for _, name := range []string{"variables", "extensions"} {
		if v := q.Get(name); v != "" {
			var obj map[string]any
			if err := json.Unmarshal([]byte(v), &obj); err != nil {
				return nil, errBadParam(name)
			}
			body[name] = obj
		}
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	post := r.Clone(r.Context())
	post.Method = http.MethodPost
	post.Header.Set("Content-Type", "application/json")
	post.Body = io.NopCloser(bytes.NewReader(b))
	post.ContentLength = int64(len(b))
	return post, nil
}

type errBadParam string

func (e errBadParam) Error() string { return string(e) + " is not a JSON object" }

// completeWithData gives the complete event a data line: an event without one is never
// dispatched by an EventSource, which would then never learn the stream ended.
type completeWithData struct{ http.ResponseWriter }

var completeEvent = []byte("event: complete\n\n")

func (c completeWithData) Write(b []byte) (int, error) {
	if bytes.Equal(b, completeEvent) {
		if _, err := c.ResponseWriter.Write([]byte("event: complete\ndata:\n\n")); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return c.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (c completeWithData) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func (c completeWithData) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
