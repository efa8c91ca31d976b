package server

import (
	"context"

	"github.com/99designs/gqlgen/graphql"

	"github.com/computeql/computeql/store"
)

// storeCallLimit gives each operation its bound on concurrent store calls (store.LimitCalls):
// whatever its aliases and lists, one request holds at most that share of the store's
// connections, and other callers are served meanwhile.
type storeCallLimit struct{ n int }

var (
	_ graphql.HandlerExtension     = storeCallLimit{}
	_ graphql.OperationInterceptor = storeCallLimit{}
)

func (storeCallLimit) ExtensionName() string                   { return "StoreCallLimit" }
func (storeCallLimit) Validate(graphql.ExecutableSchema) error { return nil }
func (l storeCallLimit) InterceptOperation(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
	return next(store.LimitCalls(ctx, l.n))
}
