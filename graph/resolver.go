// Package graph is the GraphQL edge: gqlgen's generated executable schema and thin resolvers
// that convert arguments, call one domain operation and map its result. No rule lives here.
package graph

import (
	"errors"

	"github.com/99designs/gqlgen/graphql"

	"github.com/computeql/computeql/feed"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/region"
)

// Resolver holds what the resolvers need; it is built once by the server.
type Resolver struct {
	Service *instance.Service
	// Feed delivers the event logs live to subscriptions.
	Feed *feed.Feed
}

func (r *Resolver) catalog() *region.Catalog { return r.Service.Catalog() }

// splitUserErrors separates a refusal for the input, which a payload reports in userErrors,
// from every other failure, which becomes a top-level error. The returned list is never nil
// because userErrors is a non-null list.
func splitUserErrors(err error) ([]instance.FieldError, error) {
	var invalid *instance.Invalid
	if errors.As(err, &invalid) {
		return invalid.Problems, nil
	}
	return []instance.FieldError{}, err
}

// notYet is the answer of operations a later part of the system implements.
func notYet(op string) error {
	return instance.Errorf(instance.CodeUnavailable, "%s is not available yet in this version of computeql", op)
}

func ptrIfSet[S ~string](s S) *S {
	if s == "" {
		return nil
	}
	return &s
}

func found[T any](v *T, ok bool) *T {
	if !ok {
		return nil
	}
	return v
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func change(o graphql.Omittable[*string]) instance.Change {
	v, set := o.ValueOK()
	return instance.Change{Set: set, Value: v}
}

func int64Ptr(i *int) *int64 {
	if i == nil {
		return nil
	}
	v := int64(*i)
	return &v
}
