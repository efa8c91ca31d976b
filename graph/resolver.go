// Package graph is the GraphQL edge: gqlgen's generated executable schema and thin resolvers
// that convert arguments, call one domain operation and map its result. No rule lives here.
package graph

import (
	"errors"
	"time"

	"github.com/99designs/gqlgen/graphql"

	"github.com/computeql/computeql/feed"
	"github.com/computeql/computeql/graph/model"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/region"
)

// Resolver holds what the resolvers need; it is built once by the server.
type Resolver struct {
	Service *instance.Service
	// Feed delivers the event logs live to subscriptions.
	Feed *feed.Feed
	// BookmarkEvery is how often a subscription that allows bookmarks is told how far the log
	// has gone, while events it does not match pass by.
	BookmarkEvery time.Duration
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

// splitVerbErrors is splitUserErrors for the operational verbs: besides invalid input, what
// the instance's state refuses (UNPROCESSABLE: e.g. stopping a stopped server) and a server
// count other than one (CONSISTENCY) are the payload's userErrors, about the instance named
// by input.id. Authorisation, not-found and faults stay top-level errors.
func splitVerbErrors(err error) ([]instance.FieldError, error) {
	var e *instance.Error
	if errors.As(err, &e) && (e.Code == instance.CodeUnprocessable || e.Code == instance.CodeConsistency) {
		return []instance.FieldError{{Field: []string{"input", "id"}, Code: e.Code, Message: e.Message}}, nil
	}
	return splitUserErrors(err)
}

func powerPayload(inst *instance.Instance, err error) (*model.InstancePowerPayload, error) {
	problems, err := splitVerbErrors(err)
	if err != nil {
		return nil, err
	}
	return &model.InstancePowerPayload{Instance: inst, UserErrors: problems}, nil
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
