package instance

import (
	"context"
	"strconv"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/quota"
)

// MaxQuotaLimit bounds a limit so that usage arithmetic can never overflow.
const MaxQuotaLimit = 1_000_000_000

// QuotaLimit is the limit and usage of one kind.
type QuotaLimit struct {
	Kind  quota.Kind
	Limit int64
	Used  int64
}

// Quota is an organization's limits and usage.
type Quota struct {
	OrganizationID string
	Limits         []QuotaLimit
}

// LimitRequest asks to set one kind's limit.
type LimitRequest struct {
	Kind  string
	Limit int64
}

// Quota returns the organization's limits and usage to anyone with a grant in it.
func (s *Service) Quota(ctx context.Context, org string) (*Quota, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, err
	}
	if _, ok := s.cat.Organization(org); !ok || !pr.SeesOrganization(org) {
		return nil, Errorf(CodeNotFound, "organization %q not found", org)
	}
	return s.readQuota(ctx, org)
}

func (s *Service) readQuota(ctx context.Context, org string) (*Quota, error) {
	set, used, err := s.store.Quota(ctx, org)
	if err != nil {
		return nil, internal("read quota", err)
	}
	limits := mergeLimits(s.limits(org), set)
	q := &Quota{OrganizationID: org}
	for _, k := range quota.Kinds {
		q.Limits = append(q.Limits, QuotaLimit{Kind: k, Limit: limits[k], Used: used[k]})
	}
	return q, nil
}

// setQuotaRequest is what a setQuota idempotency key's fingerprint covers.
type setQuotaRequest struct {
	Org    string
	Limits []LimitRequest
}

// SetQuota sets limits of an organization; only its admins may. A limit below current usage
// is accepted: it refuses new charges but takes nothing away. A retry with its idempotency key
// is answered with the quota as it is now.
func (s *Service) SetQuota(ctx context.Context, org string, reqs []LimitRequest, idempotencyKey *string) (*Quota, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, err
	}
	if _, ok := s.cat.Organization(org); !ok || !pr.SeesOrganization(org) {
		return nil, Errorf(CodeNotFound, "organization %q not found", org)
	}
	if !pr.Allows(org, "", auth.RoleAdmin) {
		return nil, Errorf(CodeForbidden, "only admins of organization %q may set its quota", org)
	}
	var p problems
	limits := quota.Amounts{}
	for i, r := range reqs {
		at := strconv.Itoa(i)
		k, err := quota.ParseKind(r.Kind)
		switch {
		case err != nil:
			p.add(CodeBadUserInput, path("limits", at, "kind"), "%v", err)
		case limitsHas(limits, k):
			p.add(CodeBadUserInput, path("limits", at, "kind"), "kind %s is given more than once", k)
		}
		if r.Limit < 0 || r.Limit > MaxQuotaLimit {
			p.add(CodeBadUserInput, path("limits", at, "limit"), "limit must be between 0 and %d", MaxQuotaLimit)
		}
		if err == nil {
			limits[k] = r.Limit
		}
	}
	if len(reqs) == 0 {
		p.add(CodeBadUserInput, path("limits"), "give at least one limit")
	}
	idem, err := newIdempotency(pr, idempotencyKey, "setQuota", setQuotaRequest{org, reqs})
	if err != nil {
		return nil, err
	}
	prior, err := s.recorded(ctx, org, idem)
	if err == nil && prior == "" && !p.any() {
		prior, err = s.store.SetLimits(ctx, org, limits, idem.record(org))
	}
	switch {
	case err != nil:
		return nil, internal("set quota", err)
	case prior != "":
		// A retry: the limits it set may have been changed since, and the quota as it is now
		// is the answer, as for an instance.
		if _, err := idem.replayOf(prior); err != nil {
			return nil, err
		}
		return s.readQuota(ctx, org)
	case p.any():
		return nil, p.err()
	}
	s.log.InfoContext(ctx, "quota set", "org", org, "by", pr.Subject, "limits", limits)
	return s.readQuota(ctx, org)
}

func limitsHas(a quota.Amounts, k quota.Kind) bool {
	_, ok := a[k]
	return ok
}
