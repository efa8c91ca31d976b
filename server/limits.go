package server

import (
	"context"
	"fmt"
	"strings"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/errcode"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
	"github.com/vektah/gqlparser/v2/lexer"
	"github.com/vektah/gqlparser/v2/parser"

	"github.com/computeql/computeql/instance"
)

// size is an operation's shape with every fragment expanded.
type size struct {
	// depth is the deepest field nesting, not counting below introspection fields (__schema,
	// __type), whose depth gqlparser's own MaxIntrospectionDepth rule bounds; GraphiQL's
	// introspection query is 14 levels deep.
	depth int
	// fields counts field selections, saturating at sizeCap.
	fields int
	// widest is the most fields one selection set holds, fragments flattened into it.
	widest int
	// direct is the number of fields of this selection set itself, fragments flattened.
	direct int
	// pairs is, for the selection sets of fields below this one (fragments flattened into
	// each), what the overlapping-fields rule may compare: for every two fields of one set
	// with the same response name, the product of their sizes (a field and what it selects).
	// Only a measurer that counts pairs counts it.
	pairs int
	// names sums the sizes of this set's fields by response name, fragments flattened in,
	// and their squares: the pairs of the set that flattens this one follow from them.
	names map[string]nameSizes
}

// nameSizes are the sizes of the fields of one response name in one set, summed, and their
// squares summed.
type nameSizes struct{ sum, squares int }

// pairsOf is how many field comparisons the fields of one set cost the overlapping-fields
// rule at most: for each response name, the products of the sizes of its fields taken two at
// a time. Fields of distinct names are never compared.
func pairsOf(names map[string]nameSizes) int {
	pairs := 0
	for _, n := range names {
		// Saturated before squaring, so that the product cannot overflow.
		sum := min(n.sum, 1<<30)
		pairs = addCapped(pairs, max(0, sum*sum-n.squares)/2)
	}
	return pairs
}

// sizeCap bounds the counts: a few fragments spreading each other twice over expand
// exponentially, and the counts must not overflow.
const sizeCap = 1 << 40

func addCapped(a, b int) int { return min(a+b, sizeCap) }

// measurer computes sizes in time linear in the document: each fragment is measured once
// however often it is spread. Recomputing spreads instead would let a 300-token document of
// fragments spreading each other take minutes of CPU.
type measurer struct {
	fragments map[string]*ast.FragmentDefinition
	memo      map[string]size
	visiting  map[string]bool
	// countPairs says to count pairs: the document budget does; the depth limit, which runs
	// for every operation, does not.
	countPairs bool
}

func newMeasurer(doc *ast.QueryDocument) *measurer {
	m := &measurer{fragments: map[string]*ast.FragmentDefinition{}, memo: map[string]size{}, visiting: map[string]bool{}}
	for _, f := range doc.Fragments {
		if _, ok := m.fragments[f.Name]; !ok {
			m.fragments[f.Name] = f
		}
	}
	return m
}

func (m *measurer) selectionSet(set ast.SelectionSet) size {
	var s size
	if m.countPairs {
		s.names = map[string]nameSizes{}
	}
	for _, sel := range set {
		var child size
		switch sel := sel.(type) {
		case *ast.Field:
			sub := m.selectionSet(sel.SelectionSet)
			child = size{depth: 1 + sub.depth, fields: addCapped(1, sub.fields), widest: sub.widest, direct: 1,
				pairs: addCapped(sub.pairs, pairsOf(sub.names))}
			if strings.HasPrefix(sel.Name, "__") {
				child.depth = 1
			}
			name := sel.Alias
			if name == "" {
				name = sel.Name
			}
			size := min(child.fields, 1<<30)
			s.addName(name, nameSizes{size, size * size})
		case *ast.InlineFragment:
			child = m.selectionSet(sel.SelectionSet)
			s.addNames(child.names)
		case *ast.FragmentSpread:
			// The spread itself counts as a field: validation does work for every spread,
			// of a fragment that exists or not (a set of thousands of spreads of unknown
			// names made the overlapping-fields rule compare millions of pairs).
			child = m.fragment(sel.Name)
			child.fields, child.direct = addCapped(child.fields, 1), addCapped(child.direct, 1)
			s.addNames(child.names)
		}
		s.depth = max(s.depth, child.depth)
		s.fields = addCapped(s.fields, child.fields)
		s.direct = addCapped(s.direct, child.direct)
		s.widest = max(s.widest, child.widest)
		s.pairs = addCapped(s.pairs, child.pairs)
	}
	s.widest = max(s.widest, s.direct)
	return s
}

// addName adds fields of one response name to the set's sums, when pairs are counted.
func (s *size) addName(name string, n nameSizes) {
	if s.names == nil {
		return
	}
	c := s.names[name]
	s.names[name] = nameSizes{addCapped(c.sum, n.sum), addCapped(c.squares, n.squares)}
}

// addNames adds the sums of a fragment flattened into the set.
func (s *size) addNames(names map[string]nameSizes) {
	for name, n := range names {
		s.addName(name, n)
	}
}

func (m *measurer) fragment(name string) size {
	if s, ok := m.memo[name]; ok {
		return s
	}
	f, ok := m.fragments[name]
	// Unknown fragments and cycles are validation errors of their own; they add nothing here.
	if !ok || m.visiting[name] {
		return size{}
	}
	m.visiting[name] = true
	s := m.selectionSet(f.SelectionSet)
	delete(m.visiting, name)
	m.memo[name] = s
	return s
}

// documentBudget bounds what validation and execution may be asked to do with one document.
type documentBudget struct {
	// maxFields caps the field selections of the whole document, fragments expanded: gqlparser
	// validates every operation, expanding the fragments each spreads, and every fragment
	// definition again, whichever operation is run.
	maxFields int
	// maxWidth caps the fields of one selection set: the rule that checks overlapping fields
	// compares them pairwise, so one set of 10,000 repeats of a field takes seconds.
	maxWidth int
	// maxPairs caps the comparisons that rule may make (size's pairs) in the whole document:
	// within every other budget, 70 fields of one name each selecting 70 more took it a second
	// and a half. Fields of one name meet in a set when fragments select the same field (id,
	// name) of one object: a few dozen comparisons.
	maxPairs int
}

// check returns why the document is over budget, or "".
func (b documentBudget) check(doc *ast.QueryDocument) string {
	m := newMeasurer(doc)
	m.countPairs = true
	fields, widest, pairs := 0, 0, 0
	for _, set := range documentSets(doc) {
		s := m.selectionSet(set)
		fields, widest = addCapped(fields, s.fields), max(widest, s.widest)
		pairs = addCapped(pairs, addCapped(s.pairs, pairsOf(s.names)))
	}
	switch {
	case widest > b.maxWidth:
		return fmt.Sprintf("a selection set holds %d fields with its fragments expanded; the limit is %d", widest, b.maxWidth)
	case fields > b.maxFields:
		return fmt.Sprintf("the document selects %d fields with its fragments expanded, its operations and fragment definitions together; the limit is %d", fields, b.maxFields)
	case pairs > b.maxPairs:
		return fmt.Sprintf("fields of the same name in one selection set would be compared %d times to check that they can be merged; the limit is %d", pairs, b.maxPairs)
	}
	return ""
}

// documentSets are the selection sets validation walks: each operation's and each fragment
// definition's.
func documentSets(doc *ast.QueryDocument) []ast.SelectionSet {
	sets := make([]ast.SelectionSet, 0, len(doc.Operations)+len(doc.Fragments))
	for _, op := range doc.Operations {
		sets = append(sets, op.SelectionSet)
	}
	for _, f := range doc.Fragments {
		sets = append(sets, f.SelectionSet)
	}
	return sets
}

// maxNameBytes bounds every name of a document and the operationName asked for. Validation
// messages quote names, once for every place they fail, so a long name multiplied the answer;
// no schema or client names anything nearly this long.
const maxNameBytes = 256

// documentGate refuses a document before gqlgen parses and validates it when validating it
// would cost more than the budget allows. Validation cannot be stopped once it begins (its
// rules all run in one walk), so the document is parsed here first; a document the query cache
// holds passed this gate already and is not parsed again.
type documentGate struct {
	budget    documentBudget
	maxTokens int
	cache     graphql.Cache[*ast.QueryDocument]
}

var _ interface {
	graphql.HandlerExtension
	graphql.OperationParameterMutator
} = documentGate{}

func (documentGate) ExtensionName() string                   { return "DocumentGate" }
func (documentGate) Validate(graphql.ExecutableSchema) error { return nil }

func (g documentGate) MutateOperationParameters(ctx context.Context, p *graphql.RawParams) *gqlerror.Error {
	if len(p.OperationName) > maxNameBytes {
		return validationFailed("operationName is %d bytes long; names are at most %d", len(p.OperationName), maxNameBytes)
	}
	if p.Query == "" {
		return nil
	}
	if _, ok := g.cache.Get(ctx, p.Query); ok {
		return nil
	}
	doc, err := parser.ParseQueryWithTokenLimit(&ast.Source{Input: p.Query}, g.maxTokens)
	if err != nil {
		return nil // gqlgen parses it again and says where it fails
	}
	if line, n := longestName(p.Query); n > maxNameBytes {
		return validationFailed("a name of %d bytes at line %d; names are at most %d", n, line, maxNameBytes)
	}
	if reason := g.budget.check(doc); reason != "" {
		return validationFailed("%s", reason)
	}
	return nil
}

// longestName returns the length of the longest name of a query that parses, and its line.
func longestName(query string) (line, n int) {
	lex := lexer.New(&ast.Source{Input: query})
	for {
		tok, err := lex.ReadToken()
		if err != nil || tok.Kind == lexer.EOF {
			return line, n
		}
		if tok.Kind == lexer.Name && len(tok.Value) > n {
			line, n = tok.Pos.Line, len(tok.Value)
		}
	}
}

// validationFailed is a refusal before execution with GRAPHQL_VALIDATION_FAILED.
func validationFailed(format string, args ...any) *gqlerror.Error {
	err := gqlerror.Errorf(format, args...)
	errcode.Set(err, errcode.ValidationFailed)
	return err
}

// complexityLimit is gqlgen's complexity limit, except that a subscription keeps no record of
// its complexity in its operation context: only queryCost reads the record, for queries and
// mutations, and a subscription's operation context lives as long as the subscription, each
// idle one keeping the record's map.
type complexityLimit struct{ *extension.ComplexityLimit }

func (c complexityLimit) MutateOperationContext(ctx context.Context, oc *graphql.OperationContext) *gqlerror.Error {
	if oc.Operation == nil || oc.Operation.Operation != ast.Subscription {
		return c.ComplexityLimit.MutateOperationContext(ctx, oc)
	}
	// What the limit reads of the operation, in a context that is then dropped.
	return c.ComplexityLimit.MutateOperationContext(ctx, &graphql.OperationContext{
		RawQuery: oc.RawQuery, Variables: oc.Variables, OperationName: oc.OperationName, Doc: oc.Doc,
		Extensions: oc.Extensions, Headers: oc.Headers, Operation: oc.Operation,
	})
}

// depthLimit refuses operations nested deeper than max fields, before any resolver runs.
// Complexity bounds the total work; depth additionally stops pathological nesting.
type depthLimit struct{ max int }

var _ interface {
	graphql.HandlerExtension
	graphql.OperationContextMutator
} = depthLimit{}

func (depthLimit) ExtensionName() string                   { return "DepthLimit" }
func (depthLimit) Validate(graphql.ExecutableSchema) error { return nil }
func (d depthLimit) MutateOperationContext(_ context.Context, oc *graphql.OperationContext) *gqlerror.Error {
	if oc.Operation == nil {
		return nil
	}
	if depth := newMeasurer(oc.Doc).selectionSet(oc.Operation.SelectionSet).depth; depth > d.max {
		err := gqlerror.Errorf("operation is %d levels deep; the limit is %d", depth, d.max)
		err.Extensions = map[string]any{"code": "DEPTH_LIMIT_EXCEEDED"}
		return err
	}
	return nil
}

const streamOnly = "subscriptions stream over a WebSocket or Server-Sent Events (Accept: text/event-stream), not a plain request"

// opRefusal is why a transport refuses an operation type, and the HTTP status it answers with
// (0: the status of any refusal before execution).
type opRefusal struct {
	status int
	why    string
}

// maxErrors bounds the errors of one refusal: a document within every budget can still fail
// validation at each of its thousands of fields, and the answer need not say so thousands of
// times.
const maxErrors = 100

// maxMessageBytes bounds each of those errors' messages.
const maxMessageBytes = 1024

// refuseOperations refuses the operations a transport must not serve, once parsed and
// validated and before they run, with GRAPHQL_VALIDATION_FAILED and a message saying why; and
// it answers at most maxErrors errors of any refusal, the last saying how many were left out,
// each with a code.
type refuseOperations struct {
	graphql.GraphExecutor
	refused map[ast.Operation]opRefusal
}

func (e refuseOperations) CreateOperationContext(ctx context.Context, params *graphql.RawParams) (*graphql.OperationContext, gqlerror.List) {
	oc, errs := e.GraphExecutor.CreateOperationContext(ctx, params)
	for _, err := range errs {
		// gqlgen's persisted-query extension refuses malformed extension data without a code.
		if _, ok := err.Extensions["code"]; !ok {
			errcode.Set(err, string(instance.CodeBadUserInput))
		}
		// Messages quote the document (values, paths of fragments); the answer need not.
		if len(err.Message) > maxMessageBytes {
			err.Message = strings.ToValidUTF8(err.Message[:maxMessageBytes], "") + "…"
		}
	}
	if len(errs) > maxErrors {
		more := gqlerror.Errorf("%d more errors left out", len(errs)-maxErrors+1)
		more.Extensions = map[string]any{"code": errs[0].Extensions["code"]}
		errs = append(errs[:maxErrors-1:maxErrors-1], more)
	}
	if len(errs) > 0 || oc.Operation == nil {
		return oc, errs
	}
	if r, ok := e.refused[oc.Operation.Operation]; ok {
		return oc, gqlerror.List{validationFailed("%s", r.why)}
	}
	return oc, errs
}
