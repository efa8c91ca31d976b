package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/jsonvalue"
)

// postTransport serves GraphQL over HTTP POST with a JSON body: every query and mutation of
// the API's clients. It is gqlgen's POST transport with what that one lacks:
//   - a body that is not one GraphQL request object is refused with 400 and a code, where
//     gqlgen answers without one, echoing the whole body back;
//   - an operation refused before it ran is answered without a data entry, and in
//     application/json with status 200, as the GraphQL-over-HTTP specification says;
//   - subscriptions are refused: gqlgen would hold the request open until the first event and
//     answer with that event alone, where they stream over a WebSocket or SSE (tried first).
//
// It also decodes the body in one pass (jsonvalue) and writes the answer's data as gqlgen
// made it, where gqlgen's transport scans the body twice and the data once more: on a create
// that was a tenth of the API's work.
type postTransport struct{}

var postRefused = map[ast.Operation]opRefusal{ast.Subscription: {why: streamOnly}}

func (postTransport) Supports(r *http.Request) bool {
	if r.Method != http.MethodPost || asksForWebSocket(r) {
		return false
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == mediaJSON
}

func (postTransport) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	start := graphql.Now()
	params, err := readRequest(r)
	if err != nil {
		writeError(w, r, http.StatusBadRequest, instance.CodeBadUserInput, err.Error())
		return
	}
	execute(w, r, exec, params, start, postRefused)
}

// execute runs params' operation, read from r since start, refusing the operations in
// refused once parsed and validated, and answers in the media type r accepts. A refusal
// before execution is answered without a data entry, and in application/json with 200, as
// the GraphQL-over-HTTP specification says; gqlgen's transports answer "data": null, and 422
// in application/json.
func execute(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor, params *graphql.RawParams, start time.Time, refused map[ast.Operation]opRefusal) {
	ctx := r.Context()
	mediaType := responseType(r.Header.Get("Accept"))
	w.Header().Set("Content-Type", mediaType)
	exec, oc, errs := operationContext(r, exec, params, start, refused)
	if errs != nil {
		status := refusedStatus(w, mediaType, errs)
		// A rate limit's 429 stands: retrying after it may succeed, or get the refusal.
		if status != http.StatusTooManyRequests && oc != nil && oc.Operation != nil {
			if why, ok := refused[oc.Operation.Operation]; ok && why.status != 0 {
				status = why.status
			}
		}
		if status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", http.MethodPost)
		}
		writeResponse(w, r, status, exec.DispatchError(graphql.WithOperationContext(ctx, oc), errs), false)
		return
	}
	responses, ctx := exec.DispatchOperation(ctx, oc)
	writeResponse(w, r, http.StatusOK, responses(ctx), true)
}

// operationContext parses, validates and prepares params' operation, read from r since start,
// as every HTTP transport does, refusing the operations in refused; it returns the executor
// that refuses them, to answer with.
func operationContext(r *http.Request, exec graphql.GraphExecutor, params *graphql.RawParams, start time.Time, refused map[ast.Operation]opRefusal) (graphql.GraphExecutor, *graphql.OperationContext, gqlerror.List) {
	params.Headers = r.Header
	params.ReadTime = graphql.TraceTiming{Start: start, End: graphql.Now()}
	exec = refuseOperations{exec, refused}
	oc, errs := exec.CreateOperationContext(r.Context(), params)
	return exec, oc, errs
}

// refusedStatus is the status of an answer refused before execution, which has no data:
// 429 (with Retry-After) for a rate limit, in either media type, as a request refused before
// it was parsed; else 400 in application/graphql-response+json, which must not answer 2xx
// without data, and 200 in application/json, which the GraphQL-over-HTTP specification keeps
// for clients that read no status.
func refusedStatus(w http.ResponseWriter, mediaType string, errs gqlerror.List) int {
	limited, retryAfter := false, 0
	for _, e := range errs {
		if e.Extensions["code"] == string(instance.CodeRateLimited) {
			secs, _ := e.Extensions["retryAfter"].(int)
			limited, retryAfter = true, max(retryAfter, secs)
		}
	}
	switch {
	case limited:
		// An operation of more top-level fields than the burst is never let through: it has
		// no time to retry at.
		if retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
		}
		return http.StatusTooManyRequests
	case mediaType == mediaGraphQLResponse:
		return http.StatusBadRequest
	}
	return http.StatusOK
}

// readRequest reads the GraphQL request object of r's body.
func readRequest(r *http.Request) (*graphql.RawParams, error) {
	body, err := io.ReadAll(r.Body) // bounded by limitBody
	if err != nil {
		return nil, errors.New("could not read the request body")
	}
	return decodeRequest(body)
}

// decodeRequest reads a GraphQL request object: query and operationName strings, variables
// and extensions objects, each optional (null is absent). Other keys are ignored; keys are
// matched exactly, as the GraphQL-over-HTTP specification names them.
func decodeRequest(body []byte) (*graphql.RawParams, error) {
	v, err := jsonvalue.Parse(body)
	switch {
	case errors.Is(err, jsonvalue.ErrTooDeep):
		return nil, errors.New("request body nests arrays and objects too deeply")
	case err != nil:
		return nil, errors.New("request body is not valid JSON")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New(`request body must be a JSON object {"query", "variables", "operationName"}; batches are not supported`)
	}
	p := &graphql.RawParams{}
	for _, f := range []struct {
		key  string
		into *string
	}{{"query", &p.Query}, {"operationName", &p.OperationName}} {
		switch s := obj[f.key].(type) {
		case nil:
		case string:
			*f.into = s
		default:
			return nil, errors.New(f.key + " must be a string")
		}
	}
	if p.Variables, err = objectParam("variables", obj["variables"]); err != nil {
		return nil, err
	}
	if p.Extensions, err = objectParam("extensions", obj["extensions"]); err != nil {
		return nil, err
	}
	return p, requireQuery(p, obj["query"] != nil)
}

// requireQuery refuses a request without a query, unless a persisted query stands for it: a
// request that is not a GraphQL request at all ({"qeury": …}) is a 400, as the
// GraphQL-over-HTTP specification says, not a document that fails to validate.
func requireQuery(p *graphql.RawParams, given bool) error {
	if given || p.Extensions["persistedQuery"] != nil {
		return nil
	}
	return errors.New("query is required (or extensions.persistedQuery)")
}

// objectParam is the request's parameter key, decoded as v: a JSON object, or absent (nil).
func objectParam(key string, v any) (map[string]any, error) {
	switch m := v.(type) {
	case nil:
		return nil, nil
	case map[string]any:
		return m, nil
	}
	return nil, errors.New(key + " must be a JSON object")
}

// writeResponse writes resp with the status; without its data entry when withData is false
// (the operation was refused before it ran). The data is written as gqlgen made it (compact),
// which encoding/json, given a json.RawMessage, would scan again to validate and compact.
func writeResponse(w http.ResponseWriter, r *http.Request, status int, resp *graphql.Response, withData bool) {
	out, err := appendResponse(make([]byte, 0, len(resp.Data)+256), resp, withData)
	if err != nil {
		writeError(w, r, http.StatusInternalServerError, instance.CodeInternal, "the answer could not be encoded")
		return
	}
	w.WriteHeader(status)
	w.Write(out)
}

// appendResponse appends resp as encoding/json would, in the same key order.
func appendResponse(buf []byte, resp *graphql.Response, withData bool) ([]byte, error) {
	if resp.Label != "" || resp.Path != nil || resp.HasNext != nil {
		// Incremental delivery's entries: not sent over plain POST, and rare enough for
		// reflection.
		if !withData {
			return appendMarshalled(buf, struct {
				Errors     any            `json:"errors,omitempty"`
				Extensions map[string]any `json:"extensions,omitempty"`
			}{resp.Errors, resp.Extensions})
		}
		return appendMarshalled(buf, resp)
	}
	buf = append(buf, '{')
	sep := false
	entry := func(key string) {
		if sep {
			buf = append(buf, ',')
		}
		sep = true
		buf = append(buf, '"')
		buf = append(buf, key...)
		buf = append(buf, `":`...)
	}
	var err error
	if len(resp.Errors) > 0 {
		entry("errors")
		if buf, err = appendMarshalled(buf, resp.Errors); err != nil {
			return nil, err
		}
	}
	if withData {
		entry("data")
		if len(resp.Data) == 0 {
			buf = append(buf, "null"...)
		} else {
			// <, >, & and U+2028/9 escaped, as encoding/json escapes them, so that no
			// browser ever takes an answer for HTML: one pass, with no scanner behind it.
			out := bytes.NewBuffer(buf)
			json.HTMLEscape(out, resp.Data)
			buf = out.Bytes()
		}
	}
	if len(resp.Extensions) > 0 {
		entry("extensions")
		if buf, err = appendMarshalled(buf, resp.Extensions); err != nil {
			return nil, err
		}
	}
	return append(buf, '}'), nil
}

func appendMarshalled(buf []byte, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(buf, b...), nil
}
