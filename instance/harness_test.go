package instance_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
	"github.com/computeql/computeql/store"
)

// env is a service on a freshly flushed real Redis, with the demo catalogue.
type env struct {
	svc *instance.Service
	rdb *redis.Client
	q   *countingQueue
	now time.Time
	// region is the simulated region the service's verbs act on.
	region *sim.Sim
}

// countingQueue is the real queue, counting the service's Enqueue calls per key: the queue
// coalesces, so its stream alone cannot show that an update asked for a run.
type countingQueue struct {
	*queue.Queue
	mu    sync.Mutex
	calls map[string]int
}

func (q *countingQueue) Enqueue(ctx context.Context, key string) error {
	q.mu.Lock()
	q.calls[key]++
	q.mu.Unlock()
	return q.Queue.Enqueue(ctx, key)
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvWith(t, region.Demo())
}

func newEnvWith(t testing.TB, cat *region.Catalog) *env {
	t.Helper()
	return serviceOn(t, redisServer.Client(t), cat)
}

// withCatalog returns a second environment over the SAME Redis (nothing is flushed) whose
// service validates against cat: the region's catalogue changed under existing instances.
func (e *env) withCatalog(t testing.TB, cat *region.Catalog) *env {
	t.Helper()
	e2 := serviceOn(t, e.rdb, cat)
	e2.now = e.now
	return e2
}

func serviceOn(t testing.TB, rdb *redis.Client, cat *region.Catalog) *env {
	t.Helper()
	real, err := queue.New(rdb, queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	q := &countingQueue{Queue: real, calls: map[string]int{}}
	e := &env{rdb: rdb, q: q, now: time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)}
	// The region is never clocked here: these tests cover the rules before any server exists.
	if e.region, err = sim.New(rdb, sim.Options{Catalog: cat}); err != nil {
		t.Fatal(err)
	}
	e.svc, err = instance.NewService(instance.Options{
		Catalog: cat, Store: store.New(rdb), Queue: q, Region: e.region, Now: func() time.Time { return e.now },
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// as returns a context of a principal holding one grant.
func as(subject, org, project string, role auth.Role) context.Context {
	return asGrants(subject, auth.Grant{OrganizationID: org, ProjectID: project, Role: role})
}

// asGrants returns a context of a principal holding the grants.
func asGrants(subject string, grants ...auth.Grant) context.Context {
	return auth.WithPrincipal(context.Background(), auth.Principal{Subject: subject, Grants: grants})
}

// Principals used throughout.
var (
	// acmeMember may do everything on instances in acme/web.
	acmeMember   = as("alice", "acme", "web", auth.RoleMember)
	acmeViewer   = as("victor", "acme", "web", auth.RoleViewer)
	acmeOperator = as("otto", "acme", "web", auth.RoleOperator)
	acmeAdmin    = as("ada", "acme", "", auth.RoleAdmin)
	globexMember = as("gina", "globex", "prod", auth.RoleMember)
	globexAdmin  = as("gus", "globex", "", auth.RoleAdmin)
	// nobody carries no principal at all.
	nobody = context.Background()
)

func ptr[T any](v T) *T { return &v }

// validCreate is a request that passes every rule; tests change one thing at a time.
func validCreate() instance.CreateRequest {
	return instance.CreateRequest{
		OrganizationID: "acme", ProjectID: "web", NetworkID: "net-acme-web-eu",
		Name: "web-1", FlavorID: "g1.small", ImageID: "ubuntu-24.04",
	}
}

// globexCreate is validCreate for globex/prod.
func globexCreate() instance.CreateRequest {
	return instance.CreateRequest{
		OrganizationID: "globex", ProjectID: "prod", NetworkID: "net-globex-prod-eu",
		Name: "prod-1", FlavorID: "g1.small", ImageID: "ubuntu-24.04",
	}
}

// Codes of field problems, short for the tables.
const (
	BadInput      = instance.CodeBadUserInput
	NotFound      = instance.CodeNotFound
	Unprocessable = instance.CodeUnprocessable
	Conflict      = instance.CodeConflict
	QuotaExceeded = instance.CodeQuotaExceeded
)

// in is a field path below "input".
func in(elems ...string) []string { return append([]string{"input"}, elems...) }

// problem is an expected field error: its code and exact path.
type problem struct {
	code  instance.Code
	field []string
}

func p(code instance.Code, field ...string) problem { return problem{code, in(field...)} }

func (pr problem) String() string { return fmt.Sprintf("%s@%s", pr.code, strings.Join(pr.field, ".")) }

// wantProblems asserts that err is an *instance.Invalid listing exactly want, in order, each
// with a message for the user.
func wantProblems(t testing.TB, err error, want ...problem) *instance.Invalid {
	t.Helper()
	var inv *instance.Invalid
	if !errors.As(err, &inv) {
		t.Fatalf("got error %v (%T), want *instance.Invalid with %v", err, err, want)
	}
	got := make([]problem, len(inv.Problems))
	for i, fe := range inv.Problems {
		got[i] = problem{fe.Code, fe.Field}
		if fe.Message == "" {
			t.Errorf("problem %v has no message", got[i])
		}
	}
	if !slices.EqualFunc(got, want, func(a, b problem) bool { return a.code == b.code && slices.Equal(a.field, b.field) }) {
		t.Fatalf("problems:\n got %v\nwant %v\n(%v)", got, want, err)
	}
	return inv
}

// wantCode asserts that err is a whole-operation failure (not field problems) with the code.
func wantCode(t testing.TB, err error, code instance.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s", code)
	}
	var inv *instance.Invalid
	if errors.As(err, &inv) {
		t.Fatalf("got field problems %v, want a whole-operation %s", err, code)
	}
	if got := instance.CodeOf(err); got != code {
		t.Fatalf("got code %s (%v), want %s", got, err, code)
	}
}

// create creates an instance that must be accepted.
func (e *env) create(t testing.TB, ctx context.Context, req instance.CreateRequest) *instance.Instance {
	t.Helper()
	inst, err := e.svc.Create(ctx, req)
	if err != nil {
		t.Fatalf("create %q: %v", req.Name, err)
	}
	return inst
}

// update updates an instance and the update must be accepted.
func (e *env) update(t testing.TB, ctx context.Context, req instance.UpdateRequest) *instance.Instance {
	t.Helper()
	inst, err := e.svc.Update(ctx, req)
	if err != nil {
		t.Fatalf("update %s: %v", req.ID, err)
	}
	return inst
}

// get reads an instance as the principal of ctx; it must be found. Get reads the large
// fields only when asked for (Large), and get asks for each, as a caller selecting them does.
func (e *env) get(t testing.TB, ctx context.Context, id string) *instance.Instance {
	t.Helper()
	inst, err := e.svc.Get(ctx, id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	if !inst.Partial() || inst.Tags != nil || inst.UserData != nil {
		t.Fatalf("get %s read its tags or user data before they were asked for", id)
	}
	var large instance.LargeFields
	for field, set := range map[instance.LargeField]func(instance.LargeFields){
		instance.FieldDescription: func(l instance.LargeFields) { large.Description = l.Description },
		instance.FieldTags:        func(l instance.LargeFields) { large.Tags = l.Tags },
		instance.FieldUserData:    func(l instance.LargeFields) { large.UserData = l.UserData },
	} {
		l, err := inst.Large(ctx, field)
		if err != nil {
			t.Fatalf("get %s: large field %d: %v", id, field, err)
		}
		set(l)
	}
	inst.SetLarge(large)
	return inst
}

// setLimits sets quota limits as an admin of org.
func (e *env) setLimits(t testing.TB, org string, limits map[quota.Kind]int64) {
	t.Helper()
	var reqs []instance.LimitRequest
	for _, k := range quota.Kinds {
		if v, ok := limits[k]; ok {
			reqs = append(reqs, instance.LimitRequest{Kind: string(k), Limit: v})
		}
	}
	if _, err := e.svc.SetQuota(as("quota-admin", org, "", auth.RoleAdmin), org, reqs, nil); err != nil {
		t.Fatalf("set quota of %s: %v", org, err)
	}
}

// unlimited raises every limit of org so that quota never refuses.
func (e *env) unlimited(t testing.TB, org string) {
	t.Helper()
	all := map[quota.Kind]int64{}
	for _, k := range quota.Kinds {
		all[k] = instance.MaxQuotaLimit
	}
	e.setLimits(t, org, all)
}

// quota returns the limits and usage of org by kind, read through the service.
func (e *env) quota(t testing.TB, org string) (limits, used quota.Amounts) {
	t.Helper()
	q, err := e.svc.Quota(as("quota-reader", org, "", auth.RoleViewer), org)
	if err != nil {
		t.Fatalf("quota of %s: %v", org, err)
	}
	limits, used = quota.Amounts{}, quota.Amounts{}
	for _, l := range q.Limits {
		limits[l.Kind], used[l.Kind] = l.Limit, l.Used
	}
	return limits, used
}

// wantUsed asserts the usage of every kind of org (kinds left out must be 0).
func (e *env) wantUsed(t testing.TB, org string, want quota.Amounts) {
	t.Helper()
	_, used := e.quota(t, org)
	for _, k := range quota.Kinds {
		if used[k] != want[k] {
			t.Errorf("%s used %s = %d, want %d", org, k, used[k], want[k])
		}
	}
}

// count returns how many instances of org an org-wide viewer lists.
func (e *env) count(t testing.TB, org string) int {
	t.Helper()
	page, err := e.svc.List(as("counter", org, "", auth.RoleViewer), instance.ListRequest{OrganizationID: org, WantTotal: true})
	if err != nil {
		t.Fatalf("list %s: %v", org, err)
	}
	return page.TotalCount
}

// queued returns how often the service put the instance's key on the work queue, after
// checking that the real queue holds a message for it.
func (e *env) queued(t testing.TB, inst *instance.Instance) int {
	t.Helper()
	waiting, err := e.q.Waiting(context.Background(), inst.Key())
	if err != nil {
		t.Fatalf("read queue: %v", err)
	}
	e.q.mu.Lock()
	defer e.q.mu.Unlock()
	if n := e.q.calls[inst.Key()]; n > 0 && !waiting {
		t.Errorf("%s was enqueued %d times but no message waits for it", inst.Key(), n)
	}
	return e.q.calls[inst.Key()]
}

// b64 returns s base64-encoded, as the API takes user data.
func b64(s string) *string { return ptr(base64.StdEncoding.EncodeToString([]byte(s))) }

// customCatalog returns a deep copy of the demo catalogue changed by edit, parsed (and so
// validated and indexed) with region.Parse. The shared demo catalogue is never touched.
func customCatalog(t testing.TB, edit func(c *region.Catalog)) *region.Catalog {
	t.Helper()
	return editCatalog(t, region.Demo(), edit)
}

// editCatalog is customCatalog starting from base, which is left as it is.
func editCatalog(t testing.TB, base *region.Catalog, edit func(c *region.Catalog)) *region.Catalog {
	t.Helper()
	data, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	var c region.Catalog
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	edit(&c)
	if data, err = json.Marshal(&c); err != nil {
		t.Fatal(err)
	}
	cat, err := region.Parse(data)
	if err != nil {
		t.Fatalf("custom catalogue: %v", err)
	}
	return cat
}

// without returns items without those whose id is id.
func without[T any](items []T, idOf func(*T) string, id string) []T {
	return slices.DeleteFunc(slices.Clone(items), func(x T) bool { return idOf(&x) == id })
}

// interfering is the real store with a write slipped in: before runs once, just before the
// first UpdateSpec, so it lands between the service's read and its own write, as a
// concurrent request would.
type interfering struct {
	instance.Store
	mu     sync.Mutex
	before func()
}

func (s *interfering) UpdateSpec(ctx context.Context, inst *instance.Instance, delta, limits quota.Amounts, status *instance.Status, changed []string, idem instance.Idempotency) (*instance.Refusal, error) {
	s.mu.Lock()
	f := s.before
	s.before = nil
	s.mu.Unlock()
	if f != nil {
		f()
	}
	return s.Store.UpdateSpec(ctx, inst, delta, limits, status, changed, idem)
}

// interfered returns a service over the same Redis and catalogue whose first spec write is
// preceded by before.
func (e *env) interfered(t testing.TB, before func()) *instance.Service {
	t.Helper()
	svc, err := instance.NewService(instance.Options{
		Catalog: e.svc.Catalog(), Store: &interfering{Store: store.New(e.rdb), before: before}, Queue: e.q, Region: e.region,
		Now: func() time.Time { return e.now }, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// wantInvalid asserts that err is an *instance.Invalid and returns it.
func wantInvalid(t testing.TB, err error) *instance.Invalid {
	t.Helper()
	var inv *instance.Invalid
	if !errors.As(err, &inv) {
		t.Fatalf("got %v (%T), want *instance.Invalid", err, err)
	}
	return inv
}

// run calls f(i) for i in [0, n) on n goroutines released together, and returns the errors.
func run(n int, f func(i int) error) []error {
	errs := make([]error, n)
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	ready.Add(n)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			errs[i] = f(i)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	return errs
}

// gzipped returns s compressed with gzip.
func gzipped(t testing.TB, s string) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	if _, err := w.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
