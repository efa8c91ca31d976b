package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/computeql/computeql/e2e/harness"
)

// Project is where the load puts instances; its networks take turns.
type Project struct {
	Org, ID  string
	Networks []string
}

// Projects are the demo catalogue's four projects with their two networks each.
var Projects = []Project{
	{"acme", "web", []string{"net-acme-web-eu", "net-acme-web-us"}},
	{"acme", "data", []string{"net-acme-data-eu", "net-acme-data-us"}},
	{"globex", "prod", []string{"net-globex-prod-eu", "net-globex-prod-us"}},
	{"globex", "staging", []string{"net-globex-staging-eu", "net-globex-staging-us"}},
}

// Organizations are the organizations of Projects.
var Organizations = []string{"acme", "globex"}

// flavors are what updates switch between: a change of flavor rebuilds the server, and
// charges a different number of cpus and GiB of memory.
var flavors = []string{"g1.small", "g1.medium"}

// Load sends creates, updates and deletes at a steady rate from a few concurrent actors, each
// working on instances of its own, and records every answer in a Ledger. It is bounded in
// count (Ops) and in time (its context).
type Load struct {
	// Clients are admin clients of every organization; actor i uses Clients[i%len].
	Clients []*harness.Client
	Ledger  *Ledger
	// Ops is how many mutations to send in all.
	Ops int
	// Rate is how many mutations a second to send, over all actors.
	Rate float64
	// Actors is how many send concurrently. Defaults to 8.
	Actors int
	// Names is the stem of the instances' names, e.g. vm for vm-<actor>-<n>. Defaults to vm.
	Names string
	// FailPrefix, when set, names every fifth instance created with it: the region fails
	// to build those (its failBuildPrefix).
	FailPrefix string
	// Progress, when set, is called after each mutation with how many were answered so far.
	Progress func(answered int)
	// Timeout bounds one call. Defaults to 20s.
	Timeout time.Duration

	answered atomic.Int64
	// retries counts creates sent again with their idempotency key after an unknown outcome.
	retries atomic.Int64
	mu      sync.Mutex
	counts  map[OpKind]map[Outcome]int
}

// Retries returns how many creates were sent again with their idempotency key.
func (l *Load) Retries() int { return int(l.retries.Load()) }

// Answered returns how many mutations were answered so far.
func (l *Load) Answered() int { return int(l.answered.Load()) }

func (l *Load) record(ref Ref, id string, op Op) {
	l.Ledger.Record(ref, id, op)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.counts == nil {
		l.counts = map[OpKind]map[Outcome]int{}
		for _, k := range OpKinds {
			l.counts[k] = map[Outcome]int{}
		}
	}
	l.counts[op.Kind][op.Outcome]++
}

// Counts returns how many of the load's mutations of each kind had each outcome.
func (l *Load) Counts() map[OpKind]map[Outcome]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[OpKind]map[Outcome]int{}
	for _, k := range OpKinds {
		out[k] = map[Outcome]int{}
	}
	for k, byOutcome := range l.counts {
		for o, n := range byOutcome {
			out[k][o] = n
		}
	}
	return out
}

// actor is one sequential client: it owns the instances it created.
type actor struct {
	n      int
	client *harness.Client
	rng    *rand.Rand
	seq    int
	live   []*owned
}

// owned is an instance an actor created and has not seen deleted.
type owned struct {
	ref Ref
	id  string
	// deleting: a delete was sent whose outcome is unknown; the actor sends it again.
	deleting bool
}

// Run sends the load and returns when Ops mutations were answered or ctx ends.
func (l *Load) Run(ctx context.Context) {
	actors := l.Actors
	if actors == 0 {
		actors = 8
	}
	if l.Timeout == 0 {
		l.Timeout = 20 * time.Second
	}
	if l.Names == "" {
		l.Names = "vm"
	}
	ticks := time.NewTicker(time.Duration(float64(time.Second) / l.Rate))
	defer ticks.Stop()
	var issued atomic.Int64
	var wg sync.WaitGroup
	for i := range actors {
		a := &actor{n: i, client: l.Clients[i%len(l.Clients)], rng: rand.New(rand.NewPCG(uint64(i), 11))}
		wg.Go(func() {
			for issued.Add(1) <= int64(l.Ops) {
				select {
				case <-ctx.Done():
					return
				case <-ticks.C:
				}
				l.step(ctx, a)
				if n := l.answered.Add(1); l.Progress != nil {
					l.Progress(int(n))
				}
			}
		})
	}
	wg.Wait()
}

// step sends one mutation: a create while the actor has few instances (and sometimes
// regardless), else an update or a delete of one of its instances.
func (l *Load) step(ctx context.Context, a *actor) {
	ctx, cancel := context.WithTimeout(ctx, l.Timeout)
	defer cancel()
	r := a.rng.Float64()
	switch {
	case len(a.live) < 3 || r < 0.3:
		l.create(ctx, a)
	default:
		i := a.rng.IntN(len(a.live))
		switch o := a.live[i]; {
		case o.deleting || r < 0.55:
			l.delete(ctx, a, i)
		case r < 0.7:
			l.resize(ctx, a, o)
		default:
			l.update(ctx, a, o)
		}
	}
}

func (l *Load) create(ctx context.Context, a *actor) {
	a.seq++
	p := Projects[(a.n+a.seq)%len(Projects)]
	name := fmt.Sprintf("%s-%d-%d", l.Names, a.n, a.seq)
	if l.FailPrefix != "" && a.seq%5 == 0 {
		name = fmt.Sprintf("%s%d-%d", l.FailPrefix, a.n, a.seq)
	}
	ref := Ref{Org: p.Org, Project: p.ID, Network: p.Networks[a.seq%len(p.Networks)], Name: name}
	spec := Spec{Description: fmt.Sprintf("%s op 1", name), FlavorID: flavors[0], PublicIP: a.seq%7 == 0}
	in := map[string]any{
		"organizationId": ref.Org, "projectId": ref.Project, "networkId": ref.Network, "name": ref.Name,
		"description": spec.Description, "flavorId": spec.FlavorID, "imageId": "ubuntu-24.04",
		"networking": map[string]any{"publicIP": spec.PublicIP},
	}
	// A create whose answer was lost is sent once more with the same idempotency key: the
	// instance it made (if it did) is the answer, never a second one.
	in["idempotencyKey"] = name
	var data struct {
		CreateInstance payload `json:"createInstance"`
	}
	send := func(ctx context.Context) Outcome {
		data.CreateInstance = payload{}
		err := a.client.Do(ctx, `mutation($in: CreateInstanceInput!) { createInstance(input: $in) { instance { id } userErrors { code } } }`,
			map[string]any{"in": in}, &data)
		return outcome(err, data.CreateInstance)
	}
	out := send(ctx)
	if out == Unknown {
		l.record(ref, "", Op{Kind: OpCreate, Outcome: out, At: time.Now(), Spec: spec})
		l.retries.Add(1)
		retry, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.Timeout)
		defer cancel()
		out = send(retry)
	}
	id := ""
	if out == Acked {
		id = data.CreateInstance.Instance.ID
		a.live = append(a.live, &owned{ref: ref, id: id})
	}
	l.record(ref, id, Op{Kind: OpCreate, Outcome: out, At: time.Now(), Spec: spec})
}

func (l *Load) update(ctx context.Context, a *actor, o *owned) {
	a.seq++
	spec := Spec{
		Description: fmt.Sprintf("%s op %d", o.ref.Name, a.seq),
		FlavorID:    flavors[a.rng.IntN(len(flavors))],
		PublicIP:    a.rng.IntN(5) == 0,
	}
	in := map[string]any{
		"id": o.id, "description": spec.Description, "flavorId": spec.FlavorID, "allowRebuild": true,
		"networking": map[string]any{"publicIP": spec.PublicIP},
	}
	var data struct {
		UpdateInstance payload `json:"updateInstance"`
	}
	err := a.client.Do(ctx, `mutation($in: UpdateInstanceInput!) { updateInstance(input: $in) { instance { id } userErrors { code } } }`,
		map[string]any{"in": in}, &data)
	out := outcome(err, data.UpdateInstance)
	if out == NotFound {
		a.forget(o)
	}
	l.record(o.ref, o.id, Op{Kind: OpUpdate, Outcome: out, At: time.Now(), Spec: spec})
}

// resize sends resizeInstance to g1.medium, consenting to the restart: refused while the
// instance is not provisioned, or has that flavor already (a disk never shrinks, so no resize
// goes back).
func (l *Load) resize(ctx context.Context, a *actor, o *owned) {
	var data struct {
		ResizeInstance payload `json:"resizeInstance"`
	}
	err := a.client.Do(ctx, `mutation($in: ResizeInstanceInput!) { resizeInstance(input: $in) { instance { id } userErrors { code } } }`,
		map[string]any{"in": map[string]any{"id": o.id, "flavorId": flavors[1], "allowRestart": true}}, &data)
	out := outcome(err, data.ResizeInstance)
	if out == NotFound {
		a.forget(o)
	}
	l.record(o.ref, o.id, Op{Kind: OpResize, Outcome: out, At: time.Now(), Spec: Spec{FlavorID: flavors[1]}})
}

func (l *Load) delete(ctx context.Context, a *actor, i int) {
	o := a.live[i]
	var data struct {
		DeleteInstance payload `json:"deleteInstance"`
	}
	err := a.client.Do(ctx, `mutation($in: DeleteInstanceInput!) { deleteInstance(input: $in) { instance { id } userErrors { code } } }`,
		map[string]any{"in": map[string]any{"id": o.id}}, &data)
	out := outcome(err, data.DeleteInstance)
	switch out {
	case Acked, NotFound:
		a.forget(o)
	case Unknown:
		o.deleting = true
	}
	l.record(o.ref, o.id, Op{Kind: OpDelete, Outcome: out, At: time.Now()})
}

func (a *actor) forget(o *owned) {
	for i, x := range a.live {
		if x == o {
			a.live = append(a.live[:i], a.live[i+1:]...)
			return
		}
	}
}

// payload is the part of a mutation's payload the load reads.
type payload struct {
	Instance *struct {
		ID string `json:"id"`
	} `json:"instance"`
	UserErrors []struct {
		Code string `json:"code"`
	} `json:"userErrors"`
}

// outcome classifies an answer. Top-level errors that say the mutation ran and refused
// (CONFLICT after its retries, UNPROCESSABLE, BAD_USER_INPUT, FORBIDDEN) changed nothing;
// NOT_FOUND says the instance is gone; any other failure — UNAVAILABLE, INTERNAL, a lost
// connection, a timeout — leaves the outcome unknown.
func outcome(err error, p payload) Outcome {
	var gqlErrs harness.Errors
	switch {
	case err == nil && len(p.UserErrors) == 0 && p.Instance != nil:
		return Acked
	case err == nil:
		return Refused
	case errors.As(err, &gqlErrs) && len(gqlErrs) > 0:
		switch gqlErrs[0].Code() {
		case "NOT_FOUND":
			return NotFound
		case "CONFLICT", "UNPROCESSABLE", "BAD_USER_INPUT", "FORBIDDEN":
			return Refused
		}
	}
	return Unknown
}
