package server

import (
	"errors"
	"net/http"
	"net/url"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/jsonvalue"
)

// getTransport serves queries over HTTP GET, the operation in the query string, answered as
// POST answers (execute). It refuses what GET must not carry with a code, where gqlgen's GET
// transport answers 406 with an error that has none: mutations, which caches and crawlers may
// repeat, and subscriptions, which stream.
type getTransport struct{}

const mutationOverGET = "mutations change state and are sent with POST, never GET (which caches and crawlers may repeat)"

// A mutation over GET is 405, as the GraphQL-over-HTTP specification says.
var getRefused = map[ast.Operation]opRefusal{
	ast.Mutation:     {status: http.StatusMethodNotAllowed, why: mutationOverGET},
	ast.Subscription: {why: streamOnly},
}

func (getTransport) Supports(r *http.Request) bool {
	return r.Method == http.MethodGet && !asksForWebSocket(r)
}

func (getTransport) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	start := graphql.Now()
	varyByAccept(w)
	params, err := getParams(r)
	if err != nil {
		writeError(w, r, http.StatusBadRequest, instance.CodeBadUserInput, err.Error())
		return
	}
	execute(w, r, exec, params, start, getRefused)
}

// varyByAccept says that the answer to a GET follows its Accept (its media type, and whether
// it streams), so that a cache that stores it keys it by Accept too.
func varyByAccept(w http.ResponseWriter) { w.Header().Add("Vary", "Accept") }

// getParams reads a GET request's operation from its query string: query, operationName, and
// variables and extensions as JSON objects, decoded as a POST body's are.
func getParams(r *http.Request) (*graphql.RawParams, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, errors.New("the query string is not valid: " + err.Error())
	}
	p := &graphql.RawParams{Query: q.Get("query"), OperationName: q.Get("operationName")}
	for _, f := range []struct {
		key  string
		into *map[string]any
	}{{"variables", &p.Variables}, {"extensions", &p.Extensions}} {
		s := q.Get(f.key)
		if s == "" {
			continue
		}
		v, err := jsonvalue.Parse([]byte(s))
		switch {
		case errors.Is(err, jsonvalue.ErrTooDeep):
			return nil, errors.New(f.key + " nests arrays and objects too deeply")
		case err != nil:
			return nil, errors.New(f.key + " is not valid JSON")
		}
		if *f.into, err = objectParam(f.key, v); err != nil {
			return nil, err
		}
	}
	return p, requireQuery(p, q.Has("query"))
}
