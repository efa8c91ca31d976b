package server

import (
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestDepthLimit: with MaxDepth 3, operations nesting fields 3 deep run and 4 deep are refused
// with DEPTH_LIMIT_EXCEEDED before any resolver runs; fragments, named or inline and however
// nested, count toward the depth of the fields they contain, and do not add depth themselves.
func TestDepthLimit(t *testing.T) {
	a := newAPI(t, func(o *Options) { o.MaxDepth = 3 })
	tok := a.admin(t)
	created := a.mustPost(t, tok, `mutation($input: CreateInstanceInput!) { createInstance(input: $input) { instance { id } } }`,
		map[string]any{"input": createInput("deep")})
	id := created.Data["createInstance"].(map[string]any)["instance"].(map[string]any)["id"]

	tests := []struct {
		name    string
		query   string
		refused bool
	}{
		{"3 deep", `{ me { grants { role } } }`, false},
		{"4 deep", `{ instances(organizationId: "acme") { edges { node { id } } } }`, true},
		{"3 deep next to 1 deep", `{ regions { id } me { grants { role } } }`, false},
		{"4 deep behind a shallow sibling", `{ regions { id } instances(organizationId: "acme") { totalCount edges { node { id } } } }`, true},
		{"named fragment 3 deep", `{ ...Q } fragment Q on Query { me { grants { role } } }`, false},
		{"named fragment makes 4", `{ instances(organizationId: "acme") { ...C } } fragment C on InstanceConnection { edges { node { id } } }`, true},
		{"inline fragment 3 deep", `{ ... on Query { me { ... on Principal { grants { role } } } } }`, false},
		{"inline fragment makes 4", `{ instances(organizationId: "acme") { ... on InstanceConnection { edges { node { id } } } } }`, true},
		{"inline fragment without a type makes 4", `{ instances(organizationId: "acme") { ... { edges { node { id } } } } }`, true},
		{"nested named fragments 3 deep", `{ me { ...P } } fragment P on Principal { ...G } fragment G on Principal { grants { role } }`, false},
		{"nested named fragments make 4", `{ instances(organizationId: "acme") { ...A } }
			fragment A on InstanceConnection { ...B }
			fragment B on InstanceConnection { edges { ...N } }
			fragment N on InstanceEdge { node { id } }`, true},
		{"fragment used at two depths", `{ ...Top instances(organizationId: "acme") { edges { ...Id } } }
			fragment Top on Query { regions { id } }
			fragment Id on InstanceEdge { node { id } }`, true},
		{"inline inside named makes 4", `{ instances(organizationId: "acme") { ...C } } fragment C on InstanceConnection { ... on InstanceConnection { edges { node { id } } } }`, true},
		{"skipped 4-deep field still counts", `{ me { subject } instances(organizationId: "acme") @skip(if: true) { edges { node { id } } } }`, true},
		{"introspection 3 deep", `{ __schema { queryType { name } } }`, false},
		// gqlparser's MaxIntrospectionDepth bounds introspection; it is exempt here.
		{"introspection 4 deep is exempt", `{ __schema { types { fields { name } } } }`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := a.post(t, tok, tt.query, nil)
			if !tt.refused {
				if res.Status != http.StatusOK || len(res.Errors) > 0 || res.Data == nil {
					t.Errorf("refused: status %d %s", res.Status, res.Raw)
				}
				return
			}
			wantError(t, res, http.StatusOK, "DEPTH_LIMIT_EXCEEDED")
			if res.Data != nil {
				t.Errorf("data = %v: nothing may run", res.Data)
			}
		})
	}

	// A refused mutation does not run at all.
	before := a.storeState(t)
	res := a.post(t, tok, `mutation($id: ID!) { deleteInstance(input: {id: $id}) { instance { status { provisioningStatus } } } }`, map[string]any{"id": id})
	wantError(t, res, http.StatusOK, "DEPTH_LIMIT_EXCEEDED")
	if !reflect.DeepEqual(before, a.storeState(t)) {
		t.Error("a mutation refused for its depth changed Redis")
	}
	// The same over GET.
	wantError(t, a.get(t, tok, `{ instances(organizationId: "acme") { edges { node { id } } } }`, nil), http.StatusOK, "DEPTH_LIMIT_EXCEEDED")
}

// TestGraphiQLIntrospectionPassesTheDefaults: the introspection query GraphiQL sends nests
// ofType 8 levels below fields.args.type, 14 levels in all; the default limits must serve it,
// or GraphiQL cannot load the schema.
func TestGraphiQLIntrospectionPassesTheDefaults(t *testing.T) {
	a := newAPI(t)
	res := a.post(t, a.admin(t), introspectionQuery, nil)
	if res.Status != http.StatusOK || len(res.Errors) > 0 {
		t.Fatalf("status %d: %.300s", res.Status, res.Raw)
	}
	types := res.Data["__schema"].(map[string]any)["types"].([]any)
	if len(types) < 40 {
		t.Errorf("only %d types introspected", len(types))
	}
}

const introspectionQuery = `query IntrospectionQuery {
  __schema {
    queryType { name } mutationType { name } subscriptionType { name }
    types { ...FullType }
    directives { name description locations args { ...InputValue } }
  }
}
fragment FullType on __Type {
  kind name description
  fields(includeDeprecated: true) { name description args { ...InputValue } type { ...TypeRef } isDeprecated deprecationReason }
  inputFields { ...InputValue }
  interfaces { ...TypeRef }
  enumValues(includeDeprecated: true) { name description isDeprecated deprecationReason }
  possibleTypes { ...TypeRef }
}
fragment InputValue on __InputValue { name description type { ...TypeRef } defaultValue }
fragment TypeRef on __Type {
  kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name
  ofType { kind name ofType { kind name ofType { kind name ofType { kind name } } } } } } } }
}`

// TestFragmentBombIsRefusedCheaply: fragments that each spread the next one twice expand to
// 2^n fields from a document of a few hundred tokens. The budget is measured without
// expanding (each fragment once), so the refusal comes from validation at once; were any
// step exponential, this test would not finish.
func TestFragmentBombIsRefusedCheaply(t *testing.T) {
	a := newAPI(t)
	const levels = 60
	var b strings.Builder
	b.WriteString("query { ...F0 }\n")
	for i := range levels {
		fmt.Fprintf(&b, "fragment F%d on Query { ...F%d ...F%d }\n", i, i+1, i+1)
	}
	fmt.Fprintf(&b, "fragment F%d on Query { me { subject } }\n", levels)
	res := a.post(t, a.admin(t), b.String(), nil)
	wantError(t, res, http.StatusOK, "GRAPHQL_VALIDATION_FAILED")
	if !strings.Contains(string(res.Raw), "the limit is") {
		t.Errorf("refusal does not explain the budget: %.300s", res.Raw)
	}
}

// TestWideSelectionSetsAreBounded: the overlapping-fields check compares the fields of a
// selection set pairwise, so 10,000 repeats of one field would take seconds of CPU inside
// the token limit. At most MaxWidth fields (default 200) per set, fragments flattened in.
func TestWideSelectionSetsAreBounded(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	repeat := func(n int) string { return "{ me { " + strings.Repeat("subject ", n) + "} }" }
	if res := a.post(t, tok, repeat(200), nil); res.Status != http.StatusOK || len(res.Errors) > 0 {
		t.Errorf("200 fields: status %d %.200s", res.Status, res.Raw)
	}
	for name, doc := range map[string]string{
		"201 fields":         repeat(201),
		"9,000 fields":       repeat(9000),
		"through a fragment": "{ me { ...S ...S subject } } fragment S on Principal { " + strings.Repeat("subject ", 100) + "}",
	} {
		t.Run(name, func(t *testing.T) {
			res := a.post(t, tok, doc, nil)
			wantError(t, res, http.StatusOK, "GRAPHQL_VALIDATION_FAILED")
			if !strings.Contains(string(res.Raw), "selection set holds") {
				t.Errorf("refusal does not explain the width: %.300s", res.Raw)
			}
		})
	}
	// Narrow sets that add up past MaxFields (default 5,000) are refused too.
	var many strings.Builder
	many.WriteString("{ ")
	for i := range 26 {
		fmt.Fprintf(&many, "a%d: me { %s} ", i, strings.Repeat("subject ", 199))
	}
	many.WriteString("}")
	res := a.post(t, tok, many.String(), nil)
	wantError(t, res, http.StatusOK, "GRAPHQL_VALIDATION_FAILED")
	if !strings.Contains(string(res.Raw), "the document selects 5200 fields") {
		t.Errorf("refusal does not explain the field budget: %.300s", res.Raw)
	}

	narrow := newAPI(t, func(o *Options) { o.MaxWidth = 2 })
	wantError(t, narrow.post(t, tok, `{ me { subject grants { role } } regions { id } instance(id: "x") { id } }`, nil),
		http.StatusOK, "GRAPHQL_VALIDATION_FAILED")
}

// TestComplexityLimit: with MaxComplexity 500, list fields are weighted by `first`: one page of
// instances with a 5-point selection per item costs 1 + first×5, so first:99 (496) runs and
// first:100 (501) is refused with COMPLEXITY_LIMIT_EXCEEDED, as are aliases that add up.
func TestComplexityLimit(t *testing.T) {
	a := newAPI(t, func(o *Options) { o.MaxComplexity = 500 })
	tok := a.admin(t)
	a.mustCreate(t, tok, createInput("c1"))

	tests := []struct {
		name    string
		query   string
		refused bool
	}{
		{"first 5", `{ instances(organizationId: "acme", first: 5) { edges { cursor node { id name } } } }`, false},
		{"first 98", `{ instances(organizationId: "acme", first: 98) { edges { cursor node { id name } } } }`, false},
		{"first 100", `{ instances(organizationId: "acme", first: 100) { edges { cursor node { id name } } } }`, true},
		{"first 100 as a variable", `query($n: Int = 100) { instances(organizationId: "acme", first: $n) { edges { cursor node { id name } } } }`, true},
		{"default page of 20", `{ instances(organizationId: "acme") { edges { cursor node { id name } } } }`, false},
		{"five default pages under aliases", `{
			a: instances(organizationId: "acme") { edges { cursor node { id name } } }
			b: instances(organizationId: "acme") { edges { cursor node { id name } } }
			c: instances(organizationId: "acme") { edges { cursor node { id name } } }
			d: instances(organizationId: "acme") { edges { cursor node { id name } } }
			e: instances(organizationId: "acme") { edges { cursor node { id name } } } }`, true},
		{"a page of 100 with a small selection", `{ instances(organizationId: "acme", first: 100) { edges { node { id name } } } }`, false},
		{"each store read is charged: 40 aliases of a one-event history", historyAliases(40), true},
		{"tags weigh their limit: five instances", `{ instances(organizationId: "acme", first: 5) { edges { node { tags { name value } } } } }`, true},
		{"one instance's tags", `{ instances(organizationId: "acme", first: 1) { edges { node { tags { name value } } } } }`, false},
		{"instanceEvents is weighted too", `{ instanceEvents(id: "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f", first: 100) { edges { cursor node { cursor kind } } } }`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := a.post(t, tok, tt.query, nil)
			if !tt.refused {
				if res.Status != http.StatusOK || len(res.Errors) > 0 {
					t.Errorf("refused: status %d %s", res.Status, res.Raw)
				}
				return
			}
			// gqlgen (v0.17.98) does not register its complexity code as a protocol error, so
			// the refusal is a 200 with no data.
			wantError(t, res, http.StatusOK, "COMPLEXITY_LIMIT_EXCEEDED")
			if res.Data != nil {
				t.Errorf("data = %v: nothing may run", res.Data)
			}
		})
	}
}

// TestIntrospection: introspection answers by default (GraphiQL needs it) and is refused,
// revealing nothing of the schema, with DisableIntrospection; __typename is not introspection
// and works either way.
func TestIntrospection(t *testing.T) {
	t.Run("enabled by default", func(t *testing.T) {
		a := newAPI(t)
		tok := a.admin(t)
		res := a.mustPost(t, tok, `{ __schema { queryType { name } mutationType { name } subscriptionType { name } } __type(name: "Instance") { kind } }`, nil)
		want := map[string]any{
			"__schema": map[string]any{"queryType": map[string]any{"name": "Query"}, "mutationType": map[string]any{"name": "Mutation"}, "subscriptionType": map[string]any{"name": "Subscription"}},
			"__type":   map[string]any{"kind": "OBJECT"},
		}
		if !reflect.DeepEqual(res.Data, want) {
			t.Errorf("data = %v", res.Data)
		}
	})
	t.Run("disabled", func(t *testing.T) {
		a := newAPI(t, func(o *Options) { o.DisableIntrospection = true })
		tok := a.admin(t)
		for _, q := range []string{`{ __schema { queryType { name } } }`, `{ __type(name: "Instance") { fields { name } } }`} {
			res := a.post(t, tok, q, nil)
			if res.Status != http.StatusOK || len(res.Errors) != 1 {
				t.Fatalf("%s: status %d %s", q, res.Status, res.Raw)
			}
			for k, v := range res.Data {
				if v != nil {
					t.Errorf("%s: %s revealed: %v", q, k, v)
				}
			}
			// A refusal, not an internal error.
			if got := res.codes(); len(got) != 1 || got[0] != "FORBIDDEN" {
				t.Errorf("%s: codes %v, want [FORBIDDEN]", q, got)
			}
		}
		res := a.mustPost(t, tok, `{ __typename me { __typename } }`, nil)
		if !reflect.DeepEqual(res.Data, map[string]any{"__typename": "Query", "me": map[string]any{"__typename": "Principal"}}) {
			t.Errorf("__typename: %v", res.Data)
		}
	})
}

// historyAliases is a query of n aliases of a one-event history of one instance.
func historyAliases(n int) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		fmt.Fprintf(&b, ` h%d: instanceEvents(id: "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f", first: 1) { edges { node { kind } } }`, i)
	}
	b.WriteString(" }")
	return b.String()
}

// TestValidationWorkIsBoundedPerDocument: gqlparser validates every operation of a document,
// each with the fragments it spreads, whichever one is run, and quotes a failing name at each
// place it fails. So the field budget holds for the whole document, names are at most 256
// bytes, an answer lists at most 100 errors and suggests no names: a document of a few hundred
// operations spreading one fragment with a long unknown field cannot make an answer larger
// than itself, or cost more than the budget allows.
func TestValidationWorkIsBoundedPerDocument(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	ops := func(n int, fragment string) string {
		var b strings.Builder
		b.WriteString("fragment F on Query { " + fragment + " }")
		for i := range n {
			fmt.Fprintf(&b, " query Q%d { ...F }", i)
		}
		return b.String()
	}
	post := func(query, operationName string) *gqlResponse {
		return a.do(t, tok, "application/json", mustJSON(t, map[string]any{"query": query, "operationName": operationName}))
	}
	spreads := func(n int, name func(int) string) string {
		var b strings.Builder
		for i := range n {
			b.WriteString("..." + name(i) + " ")
		}
		return b.String()
	}
	var unused strings.Builder
	for i := range 26 {
		fmt.Fprintf(&unused, "a%d: me { %s} ", i, strings.Repeat("subject ", 199))
	}
	tests := []struct {
		name, query, operationName string
		want                       string // in the only error; "" for an answer with data
	}{
		{"many operations within the budget", ops(200, "me { subject }"), "Q0", ""},
		{"many operations over the budget together", ops(1000, "a: me { subject } b: me { subject } c: me { subject }"), "Q0", "the document selects 7006 fields"},
		{"a fragment nobody spreads counts", "{ me { subject } } fragment Unused on Query { " + unused.String() + "}", "", "the document selects 5202 fields"},
		{"spreads of fragments that do not exist", "{ __typename " + spreads(2000, func(i int) string { return fmt.Sprint("f", i) }) + "}", "", "a selection set holds 2001 fields"},
		{"spreads of one unknown fragment, spread in turn", "fragment Z on Query { __typename " + spreads(300, func(int) string { return "x" }) + "} query { ...Z }", "", "a selection set holds 302 fields"},
		{"fragments selecting the same fields of one object", "{ me { ...A ...B subject } } fragment A on Principal { subject grants { role } } fragment B on Principal { subject grants { role } }", "", ""},
		{"70 fields of one name, each selecting 70", "{ " + strings.Repeat("me { "+strings.Repeat("subject ", 70)+"} ", 70) + "}", "", "would be compared 12343065 times"},
		{"a name of 257 bytes", ops(200, "f"+strings.Repeat("y", 256)), "Q0", "a name of 257 bytes at line 1; names are at most 256"},
		{"an operationName of 257 bytes", "{ me { subject } }", strings.Repeat("Q", 257), "operationName is 257 bytes long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := post(tt.query, tt.operationName)
			if tt.want == "" {
				if res.Status != http.StatusOK || len(res.Errors) > 0 {
					t.Fatalf("refused: %d %.300s", res.Status, res.Raw)
				}
				return
			}
			wantError(t, res, http.StatusOK, "GRAPHQL_VALIDATION_FAILED")
			if len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Message, tt.want) {
				t.Errorf("want the one error %q: %.300s", tt.want, res.Raw)
			}
			if len(res.Raw) > 1024 {
				t.Errorf("a refusal of %d bytes", len(res.Raw))
			}
		})
	}
	// Within every bound, a name of 256 bytes failing in 300 operations and in the fragment
	// itself: 100 errors, the last saying how many more there were, none suggesting a name.
	query := ops(300, "f"+strings.Repeat("y", 255))
	res := post(query, "Q0")
	if codes := res.codes(); res.Status != http.StatusOK || slices.ContainsFunc(codes, func(c string) bool { return c != "GRAPHQL_VALIDATION_FAILED" }) {
		t.Fatalf("status %d, codes %q", res.Status, codes)
	}
	if len(res.Errors) != 100 || res.Errors[99].Message != "202 more errors left out" {
		t.Fatalf("%d errors, the last %q", len(res.Errors), res.Errors[len(res.Errors)-1].Message)

	}
	if res := post(`{ mee { subject } }`, ""); strings.Contains(string(res.Raw), "Did you mean") {
		t.Errorf("a suggestion: %s", res.Raw)
	}
	// A message that quotes a value is cut short: the answer need not repeat the document.
	res = post(`{ me @skip(if: "`+strings.Repeat("x", 5000)+`") { subject } }`, "")
	if len(res.Errors) != 1 || len(res.Errors[0].Message) > maxMessageBytes+len("…") || !strings.HasSuffix(res.Errors[0].Message, "…") {
		t.Errorf("a message of %d bytes: %.200s", len(res.Raw), res.Raw)
	}
	// Each error quotes one name, so the answer is bounded whatever the document: 100 errors of
	// a name and some 200 bytes more.
	if len(res.Raw) > 100*(maxNameBytes+256) {
		t.Errorf("%d bytes of answer", len(res.Raw))
	}
}
