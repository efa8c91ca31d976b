package instance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/region"
)

// claimNamespace is the UUID v5 namespace of name claims. It must never change: claims of
// existing instances are derived from it.
var claimNamespace = uuid.MustParse("6d0f1b6e-3a57-4c39-9a2e-4f6f3b1c8e21")

// NameClaim returns the claim that makes a name unique on a network. It is derived, not
// looked up, so two concurrent creates of one name collide on the same key without any
// read-before-write. The name becomes the hostname, and hostnames ignore case, so names that
// differ only in case share a claim. The NUL separator cannot occur in ids or names, so
// distinct pairs never share a claim.
func NameClaim(networkID, name string) string {
	return uuid.NewSHA1(claimNamespace, []byte(networkID+"\x00"+strings.ToLower(name))).String()
}

// Options configure a Service.
type Options struct {
	// Catalog is the region's catalogue. Required.
	Catalog *region.Catalog
	// Store keeps instances. Required.
	Store Store
	// Queue receives the keys of instances to reconcile. Required.
	Queue Queue
	// Region carries out the operational verbs on backing servers. Required.
	Region region.Client
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// Service applies the instance rules on behalf of the principal in each call's context.
type Service struct {
	cat    *region.Catalog
	store  Store
	queue  Queue
	region region.Client
	log    *slog.Logger
	now    func() time.Time
}

// NewService returns a service with opts' defaults applied.
func NewService(opts Options) (*Service, error) {
	if opts.Catalog == nil || opts.Store == nil || opts.Queue == nil || opts.Region == nil {
		return nil, errors.New("instance: Catalog, Store, Queue and Region are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Service{cat: opts.Catalog, store: opts.Store, queue: opts.Queue, region: opts.Region, log: opts.Logger, now: opts.Now}, nil
}

// Catalog returns the catalogue the service validates against.
func (s *Service) Catalog() *region.Catalog { return s.cat }

// Principal returns the caller, or UNAUTHENTICATED.
func Principal(ctx context.Context) (auth.Principal, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return auth.Principal{}, Errorf(CodeUnauthenticated, "authentication required: send a bearer token")
	}
	return p, nil
}

// authorize checks that p holds at least min over the project. A caller that cannot even read
// there is told "not found", so that the existence of other tenants' resources does not leak;
// one that can read but not act is told "forbidden".
func authorize(p auth.Principal, org, project string, min auth.Role, what string) error {
	r := p.RoleIn(org, project)
	if !r.Includes(auth.RoleViewer) {
		return Errorf(CodeNotFound, "%s not found", what)
	}
	if !r.Includes(min) {
		return Errorf(CodeForbidden, "role %s in project %q does not allow this; it needs %s", r, project, min)
	}
	return nil
}

func (s *Service) limits(org string) quota.Amounts {
	if o, ok := s.cat.Organization(org); ok {
		return o.Quota
	}
	return quota.DefaultLimits()
}

// charge is what an instance of the flavor holds of its organization's quota.
func charge(f *region.Flavor, publicIP bool) quota.Amounts {
	a := quota.Amounts{quota.Servers: 1, quota.CPUs: f.CPUs, quota.MemoryGiB: f.MemoryGiB}
	if f.GPU != nil {
		a[quota.GPUs] = f.GPU.PhysicalCount
	}
	if publicIP {
		a[quota.PublicIPs] = 1
	}
	return a
}

// exceeded returns the kinds for which used+delta would go over the limit. Only growth is
// checked: an instance may always shrink, even while its organization is over a lowered limit.
func exceeded(limits, used, delta quota.Amounts) []Excess {
	var out []Excess
	for _, k := range quota.Kinds {
		if d := delta[k]; d > 0 && used[k]+d > limits[k] {
			out = append(out, Excess{Kind: k, Requested: used[k] + d, Limit: limits[k]})
		}
	}
	return out
}

func addQuotaProblems(p *problems, ex []Excess) {
	for _, e := range ex {
		f := path("flavorId")
		if e.Kind == quota.PublicIPs {
			f = path("networking", "publicIP")
		}
		p.add(CodeQuotaExceeded, f, "quota exceeded for %s: %d requested in total, limit %d", e.Kind, e.Requested, e.Limit)
	}
}

// precheckQuota reports quota problems alongside other validation failures, so a refused
// request lists everything at once. The authoritative check is the store's atomic one.
func (s *Service) precheckQuota(ctx context.Context, p *problems, org string, delta quota.Amounts) error {
	set, used, err := s.store.Quota(ctx, org)
	if err != nil {
		return fmt.Errorf("read quota: %w", err)
	}
	addQuotaProblems(p, exceeded(mergeLimits(s.limits(org), set), used, delta))
	return nil
}

func mergeLimits(defaults, set quota.Amounts) quota.Amounts {
	out := quota.Amounts{}
	for _, k := range quota.Kinds {
		out[k] = defaults[k]
		if v, ok := set[k]; ok {
			out[k] = v
		}
	}
	return out
}

// enqueue puts the instance on the work queue. The change is already committed, so a failure
// here is not the caller's: it is logged, and the periodic resync finds the instance later.
func (s *Service) enqueue(ctx context.Context, inst *Instance) {
	if err := s.queue.Enqueue(ctx, inst.Key()); err != nil {
		s.log.WarnContext(ctx, "enqueue failed; resync will pick the instance up", "instance", inst.ID, "org", inst.OrganizationID, "err", err)
	}
}

// internal is the error of a store call that failed. When the store could not be reached
// (refused or cut connections, timeouts: Redis restarting, a network blip), or said its state
// passes (ErrStoreUnavailable: loading, a replica, a failover), it is UNAVAILABLE, which tells
// the caller that retrying later is right; anything else is INTERNAL.
func internal(op string, err error) error {
	if unreachable(err) {
		return &Error{Code: CodeUnavailable, Message: "the store did not answer; retry", Err: fmt.Errorf("%s: %w", op, err)}
	}
	return &Error{Code: CodeInternal, Message: "internal error", Err: fmt.Errorf("%s: %w", op, err)}
}

// unreachable recognises a failure to reach the store rather than a failure of the request.
func unreachable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrStoreUnavailable)
}
