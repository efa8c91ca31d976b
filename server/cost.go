package server

import (
	"context"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/computeql/computeql/auth"
)

// queryCost adds extensions.cost to the answer of every query and mutation, as Shopify's API
// does, so that a client sees how close it is to a limit before it is refused: the operation's
// complexity and the most an operation may have, and, while rate limiting is on, the caller's
// bucket (requests, one per top-level field: what it holds at most, what is left now, how many
// come back per second). Subscription events carry none: their cost was paid once.
type queryCost struct{ rl *rateLimit } // rl nil: no rate limit

var (
	_ graphql.HandlerExtension    = queryCost{}
	_ graphql.ResponseInterceptor = queryCost{}
)

func (queryCost) ExtensionName() string                   { return "QueryCost" }
func (queryCost) Validate(graphql.ExecutableSchema) error { return nil }

// costExtension is extensions.cost. Structs, not maps, for what every answer carries: a map
// is encoded by reflection over sorted keys, a few microseconds an answer. The fields are in
// the order the keys of maps were written in, so the bytes are the same.
type costExtension struct {
	Maximum   int             `json:"maximumQueryCost"`
	Requested int             `json:"requestedQueryCost"`
	Throttle  *throttleStatus `json:"throttleStatus,omitempty"`
}

type throttleStatus struct {
	Available int     `json:"currentlyAvailable"`
	Maximum   int     `json:"maximumAvailable"`
	Restore   float64 `json:"restoreRate"`
}

func (c queryCost) InterceptResponse(ctx context.Context, next graphql.ResponseHandler) *graphql.Response {
	resp := next(ctx)
	if resp == nil || !graphql.HasOperationContext(ctx) {
		return resp
	}
	if op := graphql.GetOperationContext(ctx).Operation; op == nil || op.Operation == ast.Subscription {
		return resp
	}
	stats := extension.GetComplexityStats(ctx)
	if stats == nil {
		return resp
	}
	cost := &costExtension{Requested: stats.Complexity, Maximum: stats.ComplexityLimit}
	if p, ok := auth.FromContext(ctx); ok && c.rl != nil {
		cost.Throttle = &throttleStatus{
			Maximum:   c.rl.burst,
			Available: c.rl.limiter.available(p.Subject, c.rl.burst),
			Restore:   c.rl.perSecond,
		}
	}
	if resp.Extensions == nil {
		resp.Extensions = map[string]any{}
	}
	resp.Extensions["cost"] = cost
	return resp
}
