// Package auth holds who is calling: principals, their roles per organization and project,
// and the signed bearer tokens that carry them. It decides what a role allows; it knows
// nothing of instances, GraphQL or HTTP.
package auth

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Role is a level of access; each role includes everything the roles below it allow.
type Role string

// The roles, from least to most. Values are the token claim spelling.
const (
	RoleViewer   Role = "viewer"   // read
	RoleOperator Role = "operator" // read, power actions, console, SSH key, snapshot
	RoleMember   Role = "member"   // everything on instances
	RoleAdmin    Role = "admin"    // organization-wide, also quota
)

func (r Role) rank() int {
	switch r {
	case RoleViewer:
		return 1
	case RoleOperator:
		return 2
	case RoleMember:
		return 3
	case RoleAdmin:
		return 4
	}
	return 0
}

// Includes reports whether r allows at least what min allows.
func (r Role) Includes(min Role) bool { return r.rank() >= min.rank() && min.rank() > 0 }

// ParseRole parses a role name, case-insensitively.
func ParseRole(s string) (Role, error) {
	r := Role(strings.ToLower(s))
	if r.rank() == 0 {
		return "", fmt.Errorf("unknown role %q (want viewer, operator, member or admin)", s)
	}
	return r, nil
}

// Grant gives a role over one project, or over a whole organization when ProjectID is empty.
type Grant struct {
	OrganizationID string `json:"org"`
	ProjectID      string `json:"project,omitempty"`
	Role           Role   `json:"role"`
}

// Validate checks that the grant is well formed. Admin is an organization-wide role only,
// because quota and other organization settings have no project scope.
func (g Grant) Validate() error {
	if g.OrganizationID == "" {
		return fmt.Errorf("grant without an organization")
	}
	if g.Role.rank() == 0 {
		return fmt.Errorf("grant with unknown role %q", g.Role)
	}
	if g.Role == RoleAdmin && g.ProjectID != "" {
		return fmt.Errorf("admin is granted per organization, not per project (project %q)", g.ProjectID)
	}
	return nil
}

// Principal is an authenticated caller.
type Principal struct {
	Subject string
	Grants  []Grant
	// Expires is when the token that named the principal expires (its exp claim), in UTC and
	// without a monotonic clock reading, so that copies compare equal field by field. It is
	// zero for a principal that was not read from a token.
	Expires time.Time
	// Deadline is the one moment after which the token is honoured nowhere: Expires plus the
	// clock skew this process allows. A request over HTTP, an operation on a WebSocket and a
	// subscription's life all end there. Zero with Expires.
	Deadline time.Time
}

// ValidAt reports whether the principal's token is still honoured at now.
func (p Principal) ValidAt(now time.Time) bool {
	return p.Deadline.IsZero() || now.Before(p.Deadline)
}

// RoleIn returns the strongest role the principal holds over the project (an organization-wide
// grant covers every project), or "" when it holds none. With project "" only
// organization-wide grants count.
func (p Principal) RoleIn(org, project string) Role {
	var best Role
	for _, g := range p.Grants {
		if g.OrganizationID != org || (g.ProjectID != "" && g.ProjectID != project) {
			continue
		}
		if g.Role.rank() > best.rank() {
			best = g.Role
		}
	}
	return best
}

// Allows reports whether the principal holds at least min over the project.
func (p Principal) Allows(org, project string, min Role) bool {
	return p.RoleIn(org, project).Includes(min)
}

// SeesOrganization reports whether the principal holds any grant in the organization; an
// organization it cannot see is reported to it as not found.
func (p Principal) SeesOrganization(org string) bool {
	for _, g := range p.Grants {
		if g.OrganizationID == org {
			return true
		}
	}
	return false
}

// Organizations lists the organizations the principal holds grants in, each once, in grant order.
func (p Principal) Organizations() []string {
	var orgs []string
	for _, g := range p.Grants {
		seen := false
		for _, o := range orgs {
			seen = seen || o == g.OrganizationID
		}
		if !seen {
			orgs = append(orgs, g.OrganizationID)
		}
	}
	return orgs
}

type principalKey struct{}

// WithPrincipal returns a context that carries the principal.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, &p)
}

// FromContext returns the principal the context carries.
func FromContext(ctx context.Context) (Principal, bool) {
	if p, ok := SharedFromContext(ctx); ok {
		return *p, true
	}
	return Principal{}, false
}

// SharedFromContext returns the principal the context carries itself rather than a copy, for
// what keeps it as long as the context (a subscription's filter of events), where a copy would
// cost each of thousands of subscriptions its bytes again. It must not be changed.
func SharedFromContext(ctx context.Context) (*Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(*Principal)
	return p, ok
}
