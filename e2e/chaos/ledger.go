package chaos

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/computeql/computeql/instance"
)

// Spec is the part of an instance the load sets. Every create and update sets all of it, so
// each acknowledged mutation alone determines what the store must hold afterwards; a resize
// sets only the flavor.
type Spec struct {
	Description string
	FlavorID    string
	PublicIP    bool
}

// OpKind is a mutation of the load.
type OpKind string

// The mutations.
const (
	OpCreate OpKind = "create"
	OpUpdate OpKind = "update"
	OpDelete OpKind = "delete"
	OpResize OpKind = "resize"
)

// OpKinds are the mutations, in the order reports list them.
var OpKinds = []OpKind{OpCreate, OpUpdate, OpResize, OpDelete}

// Outcome is what the API answered a mutation.
type Outcome int

// The outcomes.
const (
	// Acked: the API acknowledged the mutation, so its effect must be in the store.
	Acked Outcome = iota
	// Refused: a userError, or a top-level refusal such as CONFLICT: nothing was changed.
	Refused
	// NotFound: the instance did not exist when the mutation ran.
	NotFound
	// Unknown: no answer, or an error that does not say whether the change was committed
	// (UNAVAILABLE, INTERNAL, a lost connection, a timeout): it may or may not have happened.
	Unknown
)

func (o Outcome) String() string {
	return [...]string{"acked", "refused", "not found", "unknown"}[o]
}

// Op is one mutation and its answer.
type Op struct {
	Kind    OpKind
	Outcome Outcome
	// At is when the answer arrived (for Unknown, when the call gave up).
	At time.Time
	// Spec is what a create or an update sets; of a resize, only its FlavorID.
	Spec Spec
}

// Ref names an instance as the load knows it before the API answers: its name on its network
// (names are unique per network), in its organization and project.
type Ref struct{ Org, Project, Network, Name string }

func (r Ref) String() string { return r.Org + "/" + r.Project + "/" + r.Network + "/" + r.Name }

// Ledger records every mutation the load sent and what the API answered, per instance, in the
// order the load sent them (one instance's mutations are never concurrent). It is safe for
// concurrent use.
type Ledger struct {
	mu      sync.Mutex
	entries map[Ref]*entry
}

type entry struct {
	id  string // "" until a create is acknowledged
	ops []Op
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger { return &Ledger{entries: map[Ref]*entry{}} }

// Record adds a mutation of the instance; id is the instance's id when known.
func (l *Ledger) Record(ref Ref, id string, op Op) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entries[ref]
	if e == nil {
		e = &entry{}
		l.entries[ref] = e
	}
	if id != "" {
		e.id = id
	}
	e.ops = append(e.ops, op)
}

// AckedBetween returns how many mutations were acknowledged in [from, to].
func (l *Ledger) AckedBetween(from, to time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.entries {
		for _, op := range e.ops {
			if op.Outcome == Acked && !op.At.Before(from) && !op.At.After(to) {
				n++
			}
		}
	}
	return n
}

// held is what the store may hold of one instance: nothing, or a live instance with a spec.
type held struct {
	exists bool
	spec   Spec
}

func (h held) String() string {
	if !h.exists {
		return "absent"
	}
	return fmt.Sprintf("%+v", h.spec)
}

// Check compares the ledger with the instances in the store (live and being deleted) and
// returns a violation for every instance the store holds differently from what the answers
// allow: an acknowledged create, update or delete that is not there, or an instance no
// recorded mutation created. lost reports whether a write acknowledged at a time may have
// been lost with Redis (appendfsync everysec): such a mutation may be missing; nil means none
// may be.
func (l *Ledger) Check(stored []*instance.Instance, lost func(time.Time) bool) []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lost == nil {
		lost = func(time.Time) bool { return false }
	}
	byRef := map[Ref]*instance.Instance{}
	for _, inst := range stored {
		byRef[Ref{inst.OrganizationID, inst.ProjectID, inst.NetworkID, inst.Name}] = inst
	}
	var violations []error
	refs := make([]Ref, 0, len(l.entries))
	for ref := range l.entries {
		refs = append(refs, ref)
	}
	sort.Slice(refs, func(i, j int) bool { return refs[i].String() < refs[j].String() })
	for _, ref := range refs {
		e := l.entries[ref]
		allowed, err := e.allowed(lost)
		if err != nil {
			violations = append(violations, fmt.Errorf("instance %s (%s): %w", ref, e.id, err))
			continue
		}
		inst := byRef[ref]
		delete(byRef, ref)
		got := held{}
		switch {
		case inst == nil:
		case inst.Deleting():
			violations = append(violations, fmt.Errorf("instance %s (%s) is still being deleted", ref, inst.ID))
			continue
		default:
			got = held{exists: true, spec: Spec{Description: inst.Description, FlavorID: inst.FlavorID, PublicIP: inst.Networking.PublicIP}}
		}
		if !allowed[got] {
			violations = append(violations, fmt.Errorf("instance %s (%s): the store holds %v; after the answers %s it may hold only %v",
				ref, e.id, got, e.describe(), describeSet(allowed)))
			continue
		}
		if inst != nil && e.id != "" && inst.ID != e.id {
			violations = append(violations, fmt.Errorf("instance %s: the store holds id %s, the create acknowledged %s", ref, inst.ID, e.id))
		}
	}
	for ref, inst := range byRef {
		violations = append(violations, fmt.Errorf("instance %s (%s) is in the store, but no recorded mutation created it", ref, inst.ID))
	}
	return violations
}

// allowed walks the instance's answers and returns every state the store may hold after
// them. An acknowledged mutation that cannot have been lost fixes the state; one that may
// have been lost, or whose outcome is unknown, adds its state to the possible ones; NOT_FOUND
// keeps only "absent", and is a violation if absence was impossible by then.
func (e *entry) allowed(lost func(time.Time) bool) (map[held]bool, error) {
	possible := map[held]bool{{}: true}
	for i, op := range e.ops {
		// A create or an update leads to one state; a resize changes the flavor of whichever
		// state the instance was in.
		afters := map[held]bool{{exists: op.Kind != OpDelete, spec: op.Spec}: true}
		if op.Kind == OpResize {
			afters = map[held]bool{}
			for h := range possible {
				if h.exists {
					h.spec.FlavorID = op.Spec.FlavorID
					afters[h] = true
				}
			}
		}
		switch {
		case op.Outcome == Refused:
		case op.Outcome == NotFound:
			if !possible[held{}] {
				return nil, fmt.Errorf("%s #%d was answered NOT_FOUND, but after the answers before it the instance must exist (%s)", op.Kind, i+1, e.describe())
			}
			possible = map[held]bool{{}: true}
		case op.Outcome == Acked && !lost(op.At):
			if len(afters) == 0 {
				return nil, fmt.Errorf("%s #%d was acknowledged, but after the answers before it the instance cannot exist (%s)", op.Kind, i+1, e.describe())
			}
			possible = afters
		default: // acknowledged but possibly lost with Redis, or unknown
			for h := range afters {
				possible[h] = true
			}
		}
	}
	return possible, nil
}

func (e *entry) describe() string {
	s := "["
	for i, op := range e.ops {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %s at %s", op.Kind, op.Outcome, op.At.Format("15:04:05.000"))
	}
	return s + "]"
}

func describeSet(set map[held]bool) string {
	var out []string
	for h := range set {
		out = append(out, h.String())
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}
