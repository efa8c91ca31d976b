package server

import (
	"bytes"
	"encoding/json"
	"errors"
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
	var params *graphql.RawParams
	var err error
	if r.Method == http.MethodGet {
		params, err = getParams(r)
		exec = refuseOperations{exec, map[ast.Operation]opRefusal{ast.Mutation: {why: mutationOverGET}}}
	} else if body, rerr := io.ReadAll(r.Body); rerr != nil { // bounded by limitBody
		err = errors.New("could not read the request body")
	} else {
		params, err = decodeRequest(body)
	}
	if err == nil {
		r, err = asPost(r, params)
	}
	if err != nil {
		writeError(w, r, http.StatusBadRequest, instance.CodeBadUserInput, err.Error())
		return
	}
	t.SSE.Do(completeWithData{w}, r, exec)
}

// asPost returns the request with the operation as the JSON body gqlgen's transport decodes:
// the request as this server read it, whatever it was sent as (a GET, or a POST whose keys
// gqlgen would match in any letter case and, if it could not take them, echo back whole).
func asPost(r *http.Request, p *graphql.RawParams) (*http.Request, error) {
	b, err := json.Marshal(struct {
		Query         string         `json:"query"`
		OperationName string         `json:"operationName,omitempty"`
		Variables     map[string]any `json:"variables,omitempty"`
		Extensions    map[string]any `json:"extensions,omitempty"`
	}{p.Query, p.OperationName, p.Variables, p.Extensions})
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
