package instance

import (
	"context"
	"time"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/quota"
)

// Store keeps instances durably. Every method is one atomic step: an implementation never
// leaves half of a change behind.
type Store interface {
	// Create stores a new instance (generation 1), claims its name and charges inst.Charge
	// against the organization's quota, all or nothing. limits are the organization's limits
	// for kinds that have no limit set with SetLimits. A refusal says why nothing was written.
	//
	// With an idempotency key (idem.Key not ""), a key already recorded refuses the create
	// with Refusal.Replayed; otherwise the key is recorded with the instance, in the same step.
	Create(ctx context.Context, inst *Instance, claim string, limits quota.Amounts, idem Idempotency) (*Refusal, error)
	// CreateQueued is Create, and also, when the store can do it in the same round trip, the
	// enqueue of the new instance's work key (only if the create is accepted); queued says
	// whether it did, and when it did not, the caller enqueues.
	CreateQueued(ctx context.Context, inst *Instance, claim string, limits quota.Amounts, idem Idempotency) (refusal *Refusal, queued bool, err error)
	// Idempotent returns what the idempotency key of the organization records, "" for none.
	Idempotent(ctx context.Context, org, key string) (string, error)
	// ClaimOwner returns the id of the instance that holds the name claim, "" when it is free.
	ClaimOwner(ctx context.Context, org, claim string) (string, error)
	// Get returns the instance with the id in the first of orgs that has it, or ErrNotFound.
	Get(ctx context.Context, orgs []string, id string) (*Instance, error)
	// Peek is Get without reading the large fields, which the instance's Large reads when
	// asked for: what reads that serve the API use, so that an instance whose fields are at
	// their limits costs a page or an alias a few kilobytes.
	Peek(ctx context.Context, orgs []string, id string) (*Instance, error)
	// UpdateSpec writes inst's spec if the stored generation is still inst.Generation, and
	// then increases it; charges delta against quota (negative amounts release). When status
	// is not nil it is written too, if the stored status version is still inst.StatusVersion.
	// The same step appends an UPDATED event naming the changed fields, and records an
	// idempotency key as Create does (Refusal.Replayed when it was recorded already).
	UpdateSpec(ctx context.Context, inst *Instance, delta, limits quota.Amounts, status *Status, changed []string, idem Idempotency) (*Refusal, error)
	// Act records an operational verb as an ACTION event. With changed fields (the verb
	// changed the desired state, e.g. the power), inst's spec is written in the same step,
	// compare-and-set on inst.Generation like UpdateSpec, and the event names the fields.
	// Refusal.Gone when the instance no longer exists, Refusal.Stale when it changed.
	Act(ctx context.Context, inst *Instance, changed []string, ev ActionEvent) (*Refusal, error)
	// Resize writes a resize: inst's spec compare-and-set on inst.Generation like UpdateSpec,
	// delta charged against quota (negative amounts release), and the ACTION event naming the
	// changed fields with its idempotency key, all in one step.
	Resize(ctx context.Context, inst *Instance, delta, limits quota.Amounts, changed []string, ev ActionEvent) (*Refusal, error)
	// List returns up to limit instances of the organization (of one project when project is
	// not ""), oldest first, starting after the instance with id after ("" for the start),
	// read as Peek reads them.
	List(ctx context.Context, org, project, after string, limit int) ([]*Instance, error)
	// Count returns how many instances the organization (or one of its projects) has.
	Count(ctx context.Context, org, project string) (int, error)
	// Quota returns the limits set with SetLimits (kinds never set are absent) and the usage.
	Quota(ctx context.Context, org string) (limits, used quota.Amounts, err error)
	// SetLimits sets limits for the given kinds, and records an idempotency key in the same
	// step as Create does: replayed is what the key records already, and then nothing is set.
	SetLimits(ctx context.Context, org string, limits quota.Amounts, idem Idempotency) (replayed string, err error)
	// RecordKey records an idempotency key alone, for a change made outside the store (an
	// image the region deleted): replayed is what the key records already, and then nothing
	// is written. A key of "" records nothing.
	RecordKey(ctx context.Context, org string, idem Idempotency) (replayed string, err error)
	// PutTicket keeps a stream ticket standing for the principal for ttl.
	PutTicket(ctx context.Context, ticket string, p auth.Principal, ttl time.Duration) error
	// TakeTicket returns the principal of a stream ticket and forgets the ticket, in one step;
	// ErrNoTicket when there is none.
	TakeTicket(ctx context.Context, ticket string) (auth.Principal, error)
	// PutConsoleGrant keeps a console session's grant under its token for ttl.
	PutConsoleGrant(ctx context.Context, token string, g ConsoleGrant, ttl time.Duration) error
	// TakeConsoleGrant returns the grant of a console token and forgets the token, in one
	// step; ErrNoConsoleSession when there is none.
	TakeConsoleGrant(ctx context.Context, token string) (ConsoleGrant, error)
	// Deleted returns the organization and project of a deleted instance whose history is
	// still kept, in the first of orgs that has it, or ErrNotFound.
	Deleted(ctx context.Context, orgs []string, id string) (org, project string, err error)
	// History returns up to limit events of the instance after the cursor ("" for the
	// oldest kept), oldest first, and whether more follow; ErrCursorExpired when the cursor is
	// older than the log keeps.
	History(ctx context.Context, org, id, after string, limit int) ([]Record, bool, error)
}

// Refusal says why a store refused a write.
type Refusal struct {
	// NameTaken: the name claim belongs to another instance.
	NameTaken bool
	// Stale: the generation is no longer the one the write was based on.
	Stale bool
	// StatusStale: the status version is no longer the one the write was based on.
	StatusStale bool
	// Gone: the instance no longer exists.
	Gone bool
	// Exceeded lists every kind whose limit the charge would exceed.
	Exceeded []Excess
	// Replayed is what the idempotency key already records: nothing was written.
	Replayed string
}

// Idempotency is what a write records under a mutation's idempotency key, in the same step
// as the change: Key (the hash of the caller's subject and key, "" for none) and Value (what
// a retry is answered from).
type Idempotency struct {
	Key, Value string
	// TTL is how long the key is kept when it must not be kept a day: 0 for a day.
	TTL time.Duration
	// Forget deletes the key instead: the change it recorded was undone.
	Forget bool
}

// Excess is one quota kind a charge would take over its limit.
type Excess struct {
	Kind      quota.Kind
	Requested int64 // usage after the charge
	Limit     int64
}

// Queue takes instance keys to reconcile. It is at-least-once and coalescing: enqueueing a key
// that is already waiting does nothing.
type Queue interface {
	Enqueue(ctx context.Context, key string) error
}
