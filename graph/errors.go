package graph

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/computeql/computeql/instance"
)

// ErrorPresenter maps every error a resolver returns to a GraphQL error whose
// extensions.code is a stable code. Domain errors keep their code and user-safe message;
// anything else is an internal error whose detail goes to the log, never to the caller.
// Errors gqlgen raises itself (parse, validation, complexity) already carry their own codes.
func ErrorPresenter(log *slog.Logger) graphql.ErrorPresenterFunc {
	return func(ctx context.Context, err error) *gqlerror.Error {
		var domain *instance.Error
		if errors.As(err, &domain) {
			gerr := graphql.DefaultErrorPresenter(ctx, err)
			gerr.Message = domain.Message
			setCode(gerr, domain.Code)
			if domain.Code == instance.CodeInternal {
				log.ErrorContext(ctx, "internal error", "path", gerr.Path.String(), "err", err)
			}
			return gerr
		}
		var gerr *gqlerror.Error
		if errors.As(err, &gerr) && gerr.Err == nil {
			return gerr
		}
		if introspectionDisabled(err) {
			gerr = graphql.DefaultErrorPresenter(ctx, err)
			gerr.Message = "introspection is disabled on this server"
			setCode(gerr, instance.CodeForbidden)
			return gerr
		}
		log.ErrorContext(ctx, "internal error", "err", err)
		gerr = graphql.DefaultErrorPresenter(ctx, err)
		gerr.Message = "internal error"
		setCode(gerr, instance.CodeInternal)
		return gerr
	}
}

// introspectionDisabled recognises the plain error gqlgen refuses introspection with when it
// is switched off; it has no type or sentinel to match.
func introspectionDisabled(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if err.Error() == "introspection disabled" {
			return true
		}
	}
	return false
}

func setCode(e *gqlerror.Error, code instance.Code) {
	if e.Extensions == nil {
		e.Extensions = map[string]any{}
	}
	e.Extensions["code"] = string(code)
}

// Recover turns a resolver panic into an internal error and logs its stack, so one bad
// request never takes the process down.
func Recover(log *slog.Logger) graphql.RecoverFunc {
	return func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "resolver panic", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return &instance.Error{Code: instance.CodeInternal, Message: "internal error", Err: fmt.Errorf("panic: %v", p)}
	}
}
