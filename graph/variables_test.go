package graph

import (
	"testing"

	"github.com/vektah/gqlparser/v2"
	"github.com/vektah/gqlparser/v2/ast"
)

// TestUsesVariables: a subscription's variables are let go only when nothing below its field
// reads one; every place a variable can be read below it keeps them.
func TestUsesVariables(t *testing.T) {
	schema := NewExecutableSchema(Config{}).Schema()
	for _, tt := range []struct {
		name  string
		query string
		uses  bool
	}{
		{"the field's arguments only", `subscription($o: ID!, $i: ID) { instanceEvents(organizationId: $o, instanceId: $i) { kind instance { id name } } }`, false},
		{"literals", `subscription { instanceEvents(organizationId: "acme") { kind } }`, false},
		{"@include below", `subscription($o: ID!, $n: Boolean!) { instanceEvents(organizationId: $o) { kind instance { name @include(if: $n) } } }`, true},
		{"@skip on an inline fragment", `subscription($o: ID!, $n: Boolean!) { instanceEvents(organizationId: $o) { ... on InstanceEvent @skip(if: $n) { kind } } }`, true},
		{"in a named fragment", `subscription($o: ID!, $n: Boolean!) { instanceEvents(organizationId: $o) { ...f } } fragment f on InstanceEvent { kind @include(if: $n) }`, true},
		{"on a named fragment's spread", `subscription($o: ID!, $n: Boolean!) { instanceEvents(organizationId: $o) { ...f @include(if: $n) } } fragment f on InstanceEvent { kind }`, true},
		{"a named fragment without", `subscription($o: ID!) { instanceEvents(organizationId: $o) { ...f ...f } } fragment f on InstanceEvent { kind }`, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			doc, errs := gqlparser.LoadQuery(schema, tt.query)
			if errs != nil {
				t.Fatalf("query: %v", errs)
			}
			field := doc.Operations[0].SelectionSet[0].(*ast.Field)
			if got := usesVariables(field.SelectionSet, map[string]bool{}); got != tt.uses {
				t.Errorf("usesVariables = %t, want %t", got, tt.uses)
			}
		})
	}
}
