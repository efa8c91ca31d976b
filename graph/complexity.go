package graph

import (
	"github.com/99designs/gqlgen/graphql"

	"github.com/computeql/computeql/feed"
	"github.com/computeql/computeql/instance"
)

// Complexity weights list fields by the number of items they may return, so that the
// complexity limit bounds the work a query can cause: a page of 100 instances costs 100
// times one instance.
func Complexity() ComplexityRoot {
	var c ComplexityRoot
	pageOf := func(child int, first *int, def int) int {
		n := def
		if first != nil && *first > 0 {
			n = *first
		}
		return 1 + n*child
	}
	c.Query.Instances = func(child int, _ string, _ *instance.Filter, first *int, _ *string) int {
		return pageOf(child, first, instance.DefaultPageSize)
	}
	c.Query.InstanceEvents = func(child int, _ string, first *int, _ *string) int {
		return pageOf(child, first, instance.DefaultPageSize)
	}
	return c
}

// NewSchema returns the executable schema with its resolvers and complexity weights.
func NewSchema(svc *instance.Service, events *feed.Feed) graphql.ExecutableSchema {
	return NewExecutableSchema(Config{
		Resolvers:  &Resolver{Service: svc, Feed: events},
		Complexity: Complexity(),
	})
}
