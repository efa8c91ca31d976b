package graph

import (
	"context"
	"log/slog"
	"time"

	"github.com/99designs/gqlgen/graphql"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/graph/model"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/logline"
)

// Audit logs every mutation once, after it ran: who asked (the token's subject), which
// mutation, what it named and how it ended. Instances keep their own history, but a refused
// create has no instance, and a deleted instance's history goes with it; the audit log keeps
// both. Arguments are not logged: user data and names are the caller's, not the operator's.
// Refusals before a resolver runs (authentication, rate limit, validation) are not mutations
// that ran, and are counted by the operation metrics instead.
type Audit struct {
	Log *slog.Logger
}

var _ interface {
	graphql.HandlerExtension
	graphql.FieldInterceptor
} = Audit{}

func (Audit) ExtensionName() string                   { return "Audit" }
func (Audit) Validate(graphql.ExecutableSchema) error { return nil }

// auditTarget is an input that names what its mutation acts on.
type auditTarget interface{ AuditTarget() string }

// auditProblems is a payload that may carry refusals as userErrors.
type auditProblems interface{ Problems() []instance.FieldError }

func (a Audit) InterceptField(ctx context.Context, next graphql.Resolver) (any, error) {
	fc := graphql.GetFieldContext(ctx)
	if fc == nil || fc.Object != "Mutation" || !fc.IsResolver {
		return next(ctx)
	}
	start := time.Now()
	res, err := next(ctx)
	attrs := []slog.Attr{slog.String("mutation", fc.Field.Name)}
	if p, ok := auth.FromContext(ctx); ok {
		attrs = append(attrs, slog.String("subject", p.Subject))
	}
	switch in := fc.Args["input"].(type) {
	case auditTarget:
		attrs = append(attrs, slog.String("target", in.AuditTarget()))
	case instance.CreateRequest:
		target := ""
		if p, ok := res.(*model.CreateInstancePayload); ok && p != nil && p.Instance != nil {
			target = p.Instance.ID
		}
		attrs = append(attrs, slog.String("target", target),
			slog.String("organization", in.OrganizationID), slog.String("project", in.ProjectID))
	}
	outcome := "ok"
	if err != nil {
		outcome = string(instance.CodeOf(err))
	} else if p, ok := res.(auditProblems); ok && len(p.Problems()) > 0 {
		codes := make([]string, len(p.Problems()))
		for i, pr := range p.Problems() {
			codes[i] = string(pr.Code)
		}
		outcome = codes[0]
		attrs = append(attrs, slog.Any("codes", codes))
	}
	attrs = append(attrs, slog.String("outcome", outcome), slog.Duration("duration", time.Since(start)))
	logline.Write(ctx, a.Log, slog.LevelInfo, "audit", attrs...)
	return res, err
}
