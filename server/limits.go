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
	"github.com/vektah/gqlparser/v2/validator/core"
	"github.com/vektah/gqlparser/v2/validator/rules"
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
	for _, sel := range set {
		var child size
		switch sel := sel.(type) {
		case *ast.Field:
			sub := m.selectionSet(sel.SelectionSet)
			child = size{depth: 1 + sub.depth, fields: addCapped(1, sub.fields), widest: sub.widest, direct: 1}
			if strings.HasPrefix(sel.Name, "__") {
				child.depth = 1
			}
		case *ast.InlineFragment:
			child = m.selectionSet(sel.SelectionSet)
		case *ast.FragmentSpread:
			child = m.fragment(sel.Name)
		}
		s.depth = max(s.depth, child.depth)
		s.fields = addCapped(s.fields, child.fields)
		s.direct = addCapped(s.direct, child.direct)
		s.widest = max(s.widest, child.widest)
	}
	s.widest = max(s.widest, s.direct)
	return s
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
	// maxFields caps the field selections of an operation with fragments expanded.
	maxFields int
	// maxWidth caps the fields of one selection set: the rule that checks overlapping fields
	// compares them pairwise, so one set of 10,000 repeats of a field takes seconds.
	maxWidth int
}

// check returns why the document is over budget, or "".
func (b documentBudget) check(doc *ast.QueryDocument) string {
	m := newMeasurer(doc)
	for _, op := range doc.Operations {
		s := m.selectionSet(op.SelectionSet)
		switch {
		case s.widest > b.maxWidth:
			return fmt.Sprintf("a selection set holds %d fields with its fragments expanded; the limit is %d", s.widest, b.maxWidth)
		case s.fields > b.maxFields:
			return fmt.Sprintf("operation selects %d fields with its fragments expanded; the limit is %d", s.fields, b.maxFields)
		}
	}
	return ""
}

// rules returns gqlparser's default validation rules with the overlapping-fields rule run only
// on documents within the budget: over it, validation reports the budget instead. The rule
// needs its own walk of the document to be skippable, which costs a linear pass.
func (b documentBudget) rules() *rules.Rules {
	r := rules.NewDefaultRules()
	overlapping := rules.OverlappingFieldsCanBeMergedRule
	r.RemoveRule(overlapping.Name)
	r.AddRule("DocumentBudget", func(observers *core.Events, addError core.AddErrFunc) {
		checked := false
		observers.OnOperation(func(w *core.Walker, _ *ast.OperationDefinition) {
			if checked {
				return
			}
			checked = true
			if reason := b.check(w.Document); reason != "" {
				addError(core.Message("%s", reason))
				return
			}
			inner := &core.Events{}
			overlapping.RuleFunc(inner, addError)
			core.Walk(w.Schema, w.Document, inner)
		})
	})
	return r
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

// refuseOperations refuses the operations a transport must not serve, once parsed and
// validated and before they run, with GRAPHQL_VALIDATION_FAILED and a message saying why.
type refuseOperations struct {
	graphql.GraphExecutor
	refused map[ast.Operation]string
}

func (e refuseOperations) CreateOperationContext(ctx context.Context, params *graphql.RawParams) (*graphql.OperationContext, gqlerror.List) {
	oc, errs := e.GraphExecutor.CreateOperationContext(ctx, params)
	if len(errs) > 0 || oc.Operation == nil {
		return oc, errs
	}
	if why, ok := e.refused[oc.Operation.Operation]; ok {
		err := gqlerror.Errorf("%s", why)
		errcode.Set(err, errcode.ValidationFailed)
		return oc, gqlerror.List{err}
	}
	return oc, errs
}
