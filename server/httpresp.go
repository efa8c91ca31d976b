package server

import (
	"encoding/json"
	"net/http"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/computeql/computeql/instance"
)

// writeErrors answers r with the errors alone (no data: nothing was executed) and the status,
// in the media type the client accepts, so that a client that reads error bodies only as
// application/graphql-response+json (Apollo Client 4) sees the code of a 401 or a 429.
func writeErrors(w http.ResponseWriter, r *http.Request, status int, errs gqlerror.List) {
	w.Header().Set("Content-Type", responseType(r.Header.Get("Accept")))
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"errors": errs})
}

// writeError is writeErrors of one error with its code.
func writeError(w http.ResponseWriter, r *http.Request, status int, code instance.Code, msg string) {
	writeErrors(w, r, status, gqlerror.List{{Message: msg, Extensions: map[string]any{"code": string(code)}}})
}

// unsupported answers a request no other transport serves (a Content-Type other than
// application/json, a method other than GET and POST) with 415 and a code saying what to
// send, where gqlgen alone answers "transport not supported" without one. It is the last
// transport.
type unsupported struct{}

func (unsupported) Supports(*http.Request) bool { return true }

func (unsupported) Do(w http.ResponseWriter, r *http.Request, _ graphql.GraphExecutor) {
	status, msg := http.StatusUnsupportedMediaType, "send the operation as JSON (Content-Type: application/json) with POST, a query with GET, or a subscription over a WebSocket or with Accept: text/event-stream"
	if r.Method != http.MethodGet && r.Method != http.MethodPost {
		status, msg = http.StatusMethodNotAllowed, "use POST, or GET for queries"
		w.Header().Set("Allow", "GET, POST")
	}
	writeError(w, r, status, instance.CodeBadUserInput, msg)
}
