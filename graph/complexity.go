package graph

import (
	"cmp"
	"time"

	"github.com/99designs/gqlgen/graphql"

	"github.com/computeql/computeql/feed"
	"github.com/computeql/computeql/instance"
)

// storeRead is what a field that reads the store costs beyond its items: a round trip or two
// whatever it returns. Without it, 190 aliases of a one-event history weighed 570 of the
// 20,000 allowed while costing 380 round trips.
const storeRead = 10

// Complexity weights fields by what they cost: a field that reads the store costs storeRead,
// and list fields the number of items they may return, so that the complexity limit bounds
// the work a query can cause: a page of 100 instances costs 100 times one instance.
func Complexity() ComplexityRoot {
	var c ComplexityRoot
	pageOf := func(child int, first *int, def int) int {
		n := def
		if first != nil && *first > 0 {
			n = *first
		}
		return storeRead + n*child
	}
	c.Query.Instances = func(child int, _ string, _ *instance.Filter, first *int, _ *string) int {
		return pageOf(child, first, instance.DefaultPageSize)
	}
	c.Query.InstanceEvents = func(child int, _ string, first *int, _ *string) int {
		return pageOf(child, first, instance.DefaultPageSize)
	}
	one := func(child int, _ string) int { return storeRead + child }
	c.Query.Instance = one
	c.Query.Node = one
	c.Query.InstanceSSHKey = one
	c.Query.Quota = one
	// The large fields cost what they may weigh in the answer at their limits, about a
	// kilobyte a point: a tag list is a list of up to MaxTags, user data up to 44 KB of base64.
	c.Instance.Description = func(int) int { return 4 }
	c.Instance.UserData = func(int) int { return 40 }
	c.Instance.Tags = func(child int) int { return instance.MaxTags * child }
	return c
}

// NewSchema returns the executable schema with its resolvers and complexity weights;
// bookmarkEvery is how often a subscription that allows bookmarks gets one (0: 5 s).
func NewSchema(svc *instance.Service, events *feed.Feed, bookmarkEvery time.Duration) graphql.ExecutableSchema {
	return NewExecutableSchema(Config{
		Resolvers:  &Resolver{Service: svc, Feed: events, BookmarkEvery: cmp.Or(bookmarkEvery, 5*time.Second)},
		Complexity: Complexity(),
	})
}
