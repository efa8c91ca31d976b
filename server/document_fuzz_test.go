package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/parser"
	"github.com/vektah/gqlparser/v2/validator"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/graph"
	"github.com/computeql/computeql/instance"
)

// The fuzzed API's limits are small so that mutated documents cross them often.
const (
	fuzzDepth  = 4
	fuzzFields = 30
	fuzzWidth  = 6
	fuzzPairs  = 20
	fuzzTokens = 300
	// fuzzDeadline bounds one request: far above what any document within the token limit
	// needs, even under -race, so only a runaway parse, validation or resolver reaches it.
	fuzzDeadline = 5 * time.Second
)

// resolverCodes are the codes a document that passed every limit may still get, from the
// resolvers (COMPLEXITY_LIMIT_EXCEEDED is checked apart). INTERNAL is not among them: no
// document a client can write may cause one.
var resolverCodes = []string{
	string(instance.CodeNotFound), string(instance.CodeForbidden), string(instance.CodeBadUserInput),
	string(instance.CodeUnprocessable), string(instance.CodeCursorExpired),
}

// shape is an operation's size with fragments expanded, measured the naive way: by walking
// every expansion, independently of the memoised measurer the server uses.
type shape struct {
	depth, fields, widest int
	// pairs sums, over every selection set as expanded, the products of the sizes of each two
	// of its fields of one response name.
	pairs int
	// over says the walk stopped because the fields passed fuzzFields.
	over bool
	// cyclic says a fragment spreads itself, through others or not. Validation refuses the
	// document then, and the server's measurer, which measures each fragment once, may
	// size it differently from a walk.
	cyclic bool
}

// naiveWalk expands every fragment spread where it occurs, accumulating the shape.
type naiveWalk struct {
	fragments map[string]*ast.FragmentDefinition
	s         shape
}

// newNaiveWalk returns a walk of doc, the first definition of a fragment name counting, as it
// does for the server.
func newNaiveWalk(doc *ast.QueryDocument) *naiveWalk {
	w := &naiveWalk{fragments: map[string]*ast.FragmentDefinition{}}
	for _, f := range doc.Fragments {
		if _, ok := w.fragments[f.Name]; !ok {
			w.fragments[f.Name] = f
		}
	}
	return w
}

// namedSize is a field of a set, by response name, and its size: itself and what it selects.
type namedSize struct {
	name string
	size int
}

// set walks one selection set and returns its depth and its fields directly in it,
// fragments flattened, adding those fields to flat.
func (w *naiveWalk) set(sel ast.SelectionSet, onPath map[string]bool, flat *[]namedSize) (depth, direct int) {
	for _, s := range sel {
		if w.s.over {
			return depth, direct
		}
		switch s := s.(type) {
		case *ast.Field:
			before := w.s.fields
			w.s.fields++
			w.s.over = w.s.fields > fuzzFields
			direct++
			d, _ := w.measure(s.SelectionSet, onPath)
			if strings.HasPrefix(s.Name, "__") {
				d = 0
			}
			depth = max(depth, 1+d)
			name := s.Alias
			if name == "" {
				name = s.Name
			}
			*flat = append(*flat, namedSize{name, w.s.fields - before})
		case *ast.InlineFragment:
			d, n := w.set(s.SelectionSet, onPath, flat)
			depth, direct = max(depth, d), direct+n
		case *ast.FragmentSpread:
			// A spread counts as a field of the set it is in, whatever it spreads.
			w.s.fields++
			w.s.over = w.s.fields > fuzzFields
			direct++
			f := w.fragments[s.Name]
			w.s.cyclic = w.s.cyclic || onPath[s.Name]
			if f == nil || onPath[s.Name] {
				continue
			}
			onPath[s.Name] = true
			d, n := w.set(f.SelectionSet, onPath, flat)
			delete(onPath, s.Name)
			depth, direct = max(depth, d), direct+n
		}
	}
	return depth, direct
}

// measure walks a field's own selection set, which is a selection set of its own for width
// and for the pairs of its fields of one name.
func (w *naiveWalk) measure(sel ast.SelectionSet, onPath map[string]bool) (depth, direct int) {
	var flat []namedSize
	depth, direct = w.set(sel, onPath, &flat)
	w.s.widest = max(w.s.widest, direct)
	for i := range flat {
		for j := i + 1; j < len(flat); j++ {
			if flat[i].name == flat[j].name {
				w.s.pairs += flat[i].size * flat[j].size
			}
		}
	}
	return depth, direct
}

// measureNaively returns the shape of op.
func measureNaively(doc *ast.QueryDocument, op *ast.OperationDefinition) shape {
	w := newNaiveWalk(doc)
	w.s.depth, _ = w.measure(op.SelectionSet, map[string]bool{})
	return w.s
}

// measureDocumentNaively returns the shape of the whole document, as validation walks it: every
// operation and every fragment definition, fragments expanded.
func measureDocumentNaively(doc *ast.QueryDocument) shape {
	w := newNaiveWalk(doc)
	for _, op := range doc.Operations {
		w.measure(op.SelectionSet, map[string]bool{})
	}
	for _, f := range doc.Fragments {
		w.measure(f.SelectionSet, map[string]bool{f.Name: true})
	}
	return w.s
}

// longestNameNaively is the longest run of name characters outside strings and comments,
// read by hand rather than with gqlparser's lexer. Names cannot touch numbers in GraphQL
// (1a is a syntax error), so in a document that parses every run starting with a letter or
// an underscore is a name.
func longestNameNaively(query string) int {
	longest := 0
	for i := 0; i < len(query); {
		c := query[i]
		switch {
		case strings.HasPrefix(query[i:], `"""`):
			end := strings.Index(query[i+3:], `"""`)
			for end >= 0 && query[i+3+end-1] == '\\' {
				next := strings.Index(query[i+3+end+1:], `"""`)
				if next < 0 {
					end = -1
					break
				}
				end += 1 + next
			}
			if end < 0 {
				return longest
			}
			i += 3 + end + 3
		case c == '"':
			i++
			for i < len(query) && query[i] != '"' {
				if query[i] == '\\' {
					i++
				}
				i++
			}
			i++
		case c == '#':
			for i < len(query) && query[i] != '\n' && query[i] != '\r' {
				i++
			}
		case c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z':
			j := i
			for j < len(query) && (query[j] == '_' || query[j] >= 'A' && query[j] <= 'Z' || query[j] >= 'a' && query[j] <= 'z' || query[j] >= '0' && query[j] <= '9') {
				j++
			}
			longest = max(longest, j-i)
			i = j
		case c >= '0' && c <= '9' || c == '-':
			// A number, with its exponent (1e5): its letters are not a name.
			i++
			for i < len(query) && (query[i] >= '0' && query[i] <= '9' || strings.IndexByte(".eE+-", query[i]) >= 0) {
				i++
			}
		default:
			i++
		}
	}
	return longest
}

// FuzzGraphQLDocument sends documents through the whole handler as a viewer of acme, who may
// read but change nothing, so Redis stays as it was. It checks each answer against an
// independent reading of the document: one over the token limit fails to parse; one over
// the field or width budget fails validation, naming the budget; one nested too deep is
// refused with DEPTH_LIMIT_EXCEEDED and nothing runs; a subscription, which a plain POST
// cannot stream, is refused at once; any other gets gqlparser's own verdict and, if it runs,
// only the domain's user-facing codes. No document may cause INTERNAL or an error without a
// code, or take fuzzDeadline.
func FuzzGraphQLDocument(f *testing.F) {
	a := newAPI(f, func(o *Options) {
		o.MaxDepth, o.MaxFields, o.MaxWidth, o.MaxTokens = fuzzDepth, fuzzFields, fuzzWidth, fuzzTokens
		o.MaxMergeComparisons = fuzzPairs
		o.RateLimit = -1
	})
	tok := a.token(f, "fuzz", auth.Grant{OrganizationID: "acme", Role: auth.RoleViewer})
	schema := graph.NewExecutableSchema(graph.Config{}).Schema()
	for _, s := range [][2]string{
		{`{ me { subject grants { role } } }`, ""},
		{`{ regions { id } }`, ""},
		{`{ instances(organizationId: "acme") { edges { node { id } } } }`, ""},
		{`{ instances(organizationId: "acme", first: 5, after: "aTE6MDE5MGM3YTQtNmIxZS03YzNkLTlmMDAtMWEyYjNjNGQ1ZTZm") { totalCount } }`, ""},
		{`{ instances(organizationId: "acme", after: "aTE6bm90LWFuLWlk") { totalCount } }`, ""},
		{`{ instance(id: "0190C7A4-6B1E-7C3D-9F00-1A2B3C4D5E6F") { id } }`, ""},
		{`{ instanceEvents(id: "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f", after: "ZTE6OTk5OTk5OTk5OTk5OTk5OTk5OTktMA") { edges { cursor } } }`, ""},
		{`query A { me { subject } } query B { regions { id } }`, "B"},
		{`query A { me { subject } } query B { regions { id } }`, ""},
		{`query A { me { subject } }`, "C"},
		{`query($id: ID!) { instance(id: $id) { id } }`, ""},
		{`mutation { deleteInstance(input: {id: "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f"}) { instance { id } } }`, ""},
		{`{ me { ...P } } fragment P on Principal { subject ...P }`, ""},
		{`{ ...F0 } fragment F0 on Query { ...F1 ...F1 } fragment F1 on Query { ...F2 ...F2 } fragment F2 on Query { ...F3 ...F3 } fragment F3 on Query { me { subject } }`, ""},
		{`{ me { subject subject subject subject subject subject subject } }`, ""},
		{`{ me { a: subject a: grants { role } } }`, ""},
		{`{ a: me { subject } a: me { subject } a: me { subject } a: me { subject } }`, ""},
		{`{ __schema { types { fields { type { ofType { name } } } } } }`, ""},
		{`{ instances(organizationId: "acme") { edges { node { status { conditions { reason } } } } } }`, ""},
		{strings.Repeat("{ me ", 40) + strings.Repeat("}", 40), ""},
		{"{ me { subject " + strings.Repeat("subject ", fuzzTokens) + "} }", ""},
		{`{ me { subject } } fragment Unused on Query { regions { id } }`, ""},
		{`fragment Only on Query { regions { id } }`, ""},
		{`{ me { subject }`, ""},
		{`"\u{0}" { me }`, ""},
		{``, ""},
		{`subscription { instanceEvents(organizationId: "acme") { cursor } }`, ""},
		// Over the budget only by what the spreads count, by a fragment no operation spreads,
		// and by a name's length.
		{"{ me { " + strings.Repeat("...Unknown ", fuzzFields+1) + "} }", ""},
		{`{ me { subject } } fragment U on Query { a { b c d e f } g { h i j k l } m { n o p q r } s { t u v w x } y { z aa bb cc dd } ee { ff gg hh ii jj } }`, ""},
		{"{ me { " + strings.Repeat("n", maxNameBytes+1) + ": subject } }", ""},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, query, operationName string) {
		body, err := json.Marshal(map[string]any{"query": query, "operationName": operationName})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), fuzzDeadline)
		defer cancel()
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/graphql", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		res := a.send(t, tok, req)
		if took := time.Since(start); took >= fuzzDeadline {
			t.Fatalf("took %s: %s", took, res.Raw)
		}
		codes := res.codes()
		if len(codes) == 0 && res.Data == nil || slices.Contains(codes, "") || slices.Contains(codes, string(instance.CodeInternal)) {
			t.Fatalf("no data, or an error without a code or INTERNAL: status %d %s", res.Status, res.Raw)
		}
		refused := func(status int, code string) {
			t.Helper()
			if res.Status != status || res.Data != nil || slices.ContainsFunc(codes, func(c string) bool { return c != code }) {
				t.Fatalf("want status %d, no data and only %s; got status %d %s", status, code, res.Status, res.Raw)
			}
		}
		// The name as the server reads it: JSON turned its invalid UTF-8 into U+FFFD.
		var sent struct{ OperationName string }
		if err := json.Unmarshal(body, &sent); err != nil {
			t.Fatal(err)
		}
		if len(sent.OperationName) > maxNameBytes {
			refused(http.StatusOK, "GRAPHQL_VALIDATION_FAILED")
			return
		}
		doc, err := parser.ParseQueryWithTokenLimit(&ast.Source{Input: query}, fuzzTokens)
		if err != nil {
			refused(http.StatusOK, "GRAPHQL_PARSE_FAILED")
			return
		}
		if len(doc.Operations) == 0 || longestNameNaively(query) > maxNameBytes {
			refused(http.StatusOK, "GRAPHQL_VALIDATION_FAILED")
			return
		}
		switch s := measureDocumentNaively(doc); {
		case s.cyclic:
			refused(http.StatusOK, "GRAPHQL_VALIDATION_FAILED")
			return
		case s.over || s.widest > fuzzWidth || s.pairs > fuzzPairs:
			refused(http.StatusOK, "GRAPHQL_VALIDATION_FAILED")
			if !strings.Contains(string(res.Raw), "the limit is") {
				t.Fatalf("%+v is over budget but the refusal does not say so: %s", s, res.Raw)
			}
			return
		}
		if errs := validator.Validate(schema, doc); len(errs) > 0 {
			refused(http.StatusOK, "GRAPHQL_VALIDATION_FAILED")
			return
		}
		op := doc.Operations.ForName(operationName)
		if op == nil || len(op.VariableDefinitions) > 0 && res.Status == http.StatusOK {
			// No such operation, or variables it requires were not sent.
			refused(http.StatusOK, "GRAPHQL_VALIDATION_FAILED")
			return
		}
		if s := measureNaively(doc, op); s.depth > fuzzDepth {
			refused(http.StatusOK, "DEPTH_LIMIT_EXCEEDED")
			return
		}
		if slices.Contains(codes, "COMPLEXITY_LIMIT_EXCEEDED") {
			refused(http.StatusOK, "COMPLEXITY_LIMIT_EXCEEDED")
			return
		}
		if op.Operation == ast.Subscription {
			refused(http.StatusOK, "GRAPHQL_VALIDATION_FAILED")
			return
		}
		if res.Status != http.StatusOK || slices.ContainsFunc(codes, func(c string) bool { return !slices.Contains(resolverCodes, c) }) {
			t.Fatalf("a document within every limit got status %d %s", res.Status, res.Raw)
		}
	})
}
