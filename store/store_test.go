package store

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/redistest"
)

var redisServer *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &redisServer) }

var ctx = context.Background()

func newInstance(org, project, name string) *instance.Instance {
	id, _ := uuid.NewV7()
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	return &instance.Instance{
		ID: id.String(), OrganizationID: org, ProjectID: project,
		Spec: instance.Spec{
			Name: name, NetworkID: "net-1", RegionID: "eu", FlavorID: "f", ImageID: "i",
			Charge:    quota.Amounts{quota.Servers: 1, quota.CPUs: 2},
			CreatedAt: now, UpdatedAt: now,
		},
		Status: instance.Status{ProvisioningStatus: instance.ProvisioningPending, PowerState: instance.PowerPending, HealthStatus: instance.HealthUnknown},
	}
}

var roomy = quota.Amounts{quota.Servers: 100, quota.CPUs: 100, quota.GPUs: 0, quota.PublicIPs: 1, quota.MemoryGiB: 100}

func hgetall(t *testing.T, rdb *redis.Client, key string) map[string]string {
	t.Helper()
	m, err := rdb.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCreateWritesEverythingAtomically(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	inst := newInstance("acme", "web", "a")
	refusal, err := s.Create(ctx, inst, "claim-a", roomy, instance.Idempotency{})
	if err != nil || refusal != nil {
		t.Fatalf("create: %v %+v", err, refusal)
	}
	if got := rdb.Get(ctx, claimKey("acme", "claim-a")).Val(); got != inst.ID {
		t.Errorf("claim holds %q, want %q", got, inst.ID)
	}
	h := hgetall(t, rdb, instanceKey("acme", inst.ID))
	if h["gen"] != "1" || h["sv"] != "1" || h["proj"] != "web" {
		t.Errorf("instance hash = %v", h)
	}
	var spec instance.Spec
	if err := json.Unmarshal([]byte(h["spec"]), &spec); err != nil || spec.Name != "a" {
		t.Errorf("spec = %s (%v)", h["spec"], err)
	}
	for _, key := range []string{orgIndexKey("acme"), projectIndexKey("acme", "web")} {
		if members := rdb.ZRange(ctx, key, 0, -1).Val(); !reflect.DeepEqual(members, []string{inst.ID}) {
			t.Errorf("%s = %v", key, members)
		}
	}
	if q := hgetall(t, rdb, quotaKey("acme")); q["used:servers"] != "1" || q["used:cpus"] != "2" || len(q) != 2 {
		t.Errorf("quota = %v", q)
	}
}

func TestCreateRefusalsWriteNothing(t *testing.T) {
	tests := []struct {
		name   string
		seed   map[string]string // quota hash before
		claim  bool              // claim taken before
		limits quota.Amounts
		want   instance.Refusal
	}{
		{name: "name taken", claim: true, limits: roomy, want: instance.Refusal{NameTaken: true}},
		{name: "default limit", limits: quota.Amounts{quota.Servers: 0, quota.CPUs: 100},
			want: instance.Refusal{Exceeded: []instance.Excess{{Kind: quota.Servers, Requested: 1, Limit: 0}}}},
		{name: "set limit wins over default", seed: map[string]string{"limit:cpus": "1"}, limits: roomy,
			want: instance.Refusal{Exceeded: []instance.Excess{{Kind: quota.CPUs, Requested: 2, Limit: 1}}}},
		{name: "usage counts", seed: map[string]string{"used:servers": "100"}, limits: roomy,
			want: instance.Refusal{Exceeded: []instance.Excess{{Kind: quota.Servers, Requested: 101, Limit: 100}}}},
		{name: "every reason at once", claim: true, limits: quota.Amounts{},
			want: instance.Refusal{NameTaken: true, Exceeded: []instance.Excess{
				{Kind: quota.Servers, Requested: 1, Limit: 0}, {Kind: quota.CPUs, Requested: 2, Limit: 0}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb := redisServer.Client(t)
			if len(tt.seed) > 0 {
				rdb.HSet(ctx, quotaKey("acme"), tt.seed)
			}
			if tt.claim {
				rdb.Set(ctx, claimKey("acme", "c"), "other", 0)
			}
			before := rdb.Keys(ctx, "*").Val()
			quotaBefore := hgetall(t, rdb, quotaKey("acme"))
			inst := newInstance("acme", "web", "a")
			refusal, err := New(rdb).Create(ctx, inst, "c", tt.limits, instance.Idempotency{})
			if err != nil {
				t.Fatal(err)
			}
			if refusal == nil || !reflect.DeepEqual(*refusal, tt.want) {
				t.Fatalf("refusal = %+v, want %+v", refusal, tt.want)
			}
			if after := rdb.Keys(ctx, "*").Val(); len(after) != len(before) {
				t.Errorf("keys changed: %v -> %v", before, after)
			}
			if q := hgetall(t, rdb, quotaKey("acme")); !reflect.DeepEqual(q, quotaBefore) {
				t.Errorf("quota changed: %v -> %v", quotaBefore, q)
			}
		})
	}
}

func TestUpdateSpec(t *testing.T) {
	status := &instance.Status{ProvisioningStatus: instance.ProvisioningDeprovisioning}
	tests := []struct {
		name        string
		gen, sv     int64
		status      *instance.Status
		delta       quota.Amounts
		want        *instance.Refusal
		wantGen     string
		wantSV      string
		wantServers string
	}{
		{name: "spec only", gen: 1, wantGen: "2", wantSV: "1", wantServers: "1"},
		{name: "spec and status", gen: 1, sv: 1, status: status, wantGen: "2", wantSV: "2", wantServers: "1"},
		{name: "charge and release", gen: 1, delta: quota.Amounts{quota.Servers: -1, quota.PublicIPs: 1}, wantGen: "2", wantSV: "1", wantServers: "0"},
		{name: "stale generation", gen: 7, want: &instance.Refusal{Stale: true}, wantGen: "1", wantSV: "1", wantServers: "1"},
		{name: "stale status", gen: 1, sv: 9, status: status, want: &instance.Refusal{StatusStale: true}, wantGen: "1", wantSV: "1", wantServers: "1"},
		{name: "over quota", gen: 1, delta: quota.Amounts{quota.PublicIPs: 2},
			want:    &instance.Refusal{Exceeded: []instance.Excess{{Kind: quota.PublicIPs, Requested: 2, Limit: 1}}},
			wantGen: "1", wantSV: "1", wantServers: "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb := redisServer.Client(t)
			s := New(rdb)
			inst := newInstance("acme", "web", "a")
			if r, err := s.Create(ctx, inst, "c", roomy, instance.Idempotency{}); err != nil || r != nil {
				t.Fatal(err, r)
			}
			inst.Generation, inst.StatusVersion = tt.gen, tt.sv
			inst.Description = "changed"
			refusal, err := s.UpdateSpec(ctx, inst, tt.delta, roomy, tt.status, []string{"description"}, instance.Idempotency{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(refusal, tt.want) {
				t.Fatalf("refusal = %+v, want %+v", refusal, tt.want)
			}
			h := hgetall(t, rdb, instanceKey("acme", inst.ID))
			if h["gen"] != tt.wantGen || h["sv"] != tt.wantSV {
				t.Errorf("gen/sv = %s/%s, want %s/%s", h["gen"], h["sv"], tt.wantGen, tt.wantSV)
			}
			if got := hgetall(t, rdb, quotaKey("acme"))["used:servers"]; got != tt.wantServers {
				t.Errorf("used servers = %s, want %s", got, tt.wantServers)
			}
			got, err := s.Get(ctx, []string{"acme"}, inst.ID)
			if err != nil {
				t.Fatal(err)
			}
			if changed := got.Description == "changed"; changed != (tt.want == nil) {
				t.Errorf("spec written = %v, want %v", changed, tt.want == nil)
			}
			if wroteStatus := got.Status.ProvisioningStatus == instance.ProvisioningDeprovisioning; wroteStatus != (tt.want == nil && tt.status != nil) {
				t.Errorf("status written = %v", wroteStatus)
			}
		})
	}
}

func TestUpdateSpecOfForgottenInstance(t *testing.T) {
	rdb := redisServer.Client(t)
	inst := newInstance("acme", "web", "a")
	inst.Generation = 1
	refusal, err := New(rdb).UpdateSpec(ctx, inst, nil, roomy, nil, nil, instance.Idempotency{})
	if err != nil || refusal == nil || !refusal.Gone {
		t.Fatalf("refusal = %+v, %v", refusal, err)
	}
	if n := rdb.DBSize(ctx).Val(); n != 0 {
		t.Errorf("%d keys written", n)
	}
}

func TestGetLooksOnlyInTheGivenOrganizations(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	inst := newInstance("globex", "prod", "a")
	if r, err := s.Create(ctx, inst, "c", roomy, instance.Idempotency{}); err != nil || r != nil {
		t.Fatal(err, r)
	}
	if _, err := s.Get(ctx, []string{"acme"}, inst.ID); err != instance.ErrNotFound {
		t.Errorf("get from acme: %v, want ErrNotFound", err)
	}
	got, err := s.Get(ctx, []string{"acme", "globex"}, inst.ID)
	if err != nil || got.OrganizationID != "globex" || got.ProjectID != "prod" || got.Generation != 1 {
		t.Errorf("get = %+v, %v", got, err)
	}
}

func TestListPagesInCreationOrder(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	var want []string
	for i := range 25 {
		project := "web"
		if i%3 == 0 {
			project = "data"
		}
		inst := newInstance("acme", project, fmt.Sprint("n", i))
		if r, err := s.Create(ctx, inst, inst.Name, roomy, instance.Idempotency{}); err != nil || r != nil {
			t.Fatal(err, r)
		}
		if project == "web" {
			want = append(want, inst.ID)
		}
	}
	var got []string
	for after := ""; ; {
		page, err := s.List(ctx, "acme", "web", after, 4)
		if err != nil {
			t.Fatal(err)
		}
		for _, inst := range page {
			got = append(got, inst.ID)
		}
		if len(page) < 4 {
			break
		}
		after = page[len(page)-1].ID
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("listed %v\nwant %v", got, want)
	}
	if n, err := s.Count(ctx, "acme", "web"); err != nil || n != len(want) {
		t.Errorf("count web = %d, %v", n, err)
	}
	if n, err := s.Count(ctx, "acme", ""); err != nil || n != 25 {
		t.Errorf("count org = %d, %v", n, err)
	}
}

func TestQuotaLimits(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	rdb.HSet(ctx, quotaKey("acme"), "used:servers", 3)
	if _, err := s.SetLimits(ctx, "acme", quota.Amounts{quota.Servers: 5, quota.GPUs: 0}, instance.Idempotency{}); err != nil {
		t.Fatal(err)
	}
	limits, used, err := s.Quota(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(limits, quota.Amounts{quota.Servers: 5, quota.GPUs: 0}) || !reflect.DeepEqual(used, quota.Amounts{quota.Servers: 3}) {
		t.Errorf("limits %v used %v", limits, used)
	}
}

func TestScriptsSurviveScriptFlush(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	// A restarted Redis forgets loaded scripts; calls must still work.
	rdb.ScriptFlush(ctx)
	if r, err := s.Create(ctx, newInstance("acme", "web", "a"), "c", roomy, instance.Idempotency{}); err != nil || r != nil {
		t.Fatalf("create after SCRIPT FLUSH: %v %+v", err, r)
	}
}

func TestKeysShareTheOrganizationSlot(t *testing.T) {
	keys := []string{claimKey("acme", "c"), instanceKey("acme", "i"), orgIndexKey("acme"), projectIndexKey("acme", "p"), quotaKey("acme")}
	// A key's Cluster slot is derived from its hash tag alone (the text between the first '{'
	// and the next '}'), so equal tags mean one slot.
	for _, k := range keys {
		if tag := hashTag(k); tag != "o:acme" {
			t.Errorf("%s has hash tag %q", k, tag)
		}
	}
}

func hashTag(key string) string {
	start := -1
	for i, c := range key {
		if c == '{' && start < 0 {
			start = i
		} else if c == '}' && start >= 0 {
			if i > start+1 {
				return key[start+1 : i]
			}
			return key
		}
	}
	return key
}

func BenchmarkCreate(b *testing.B) {
	rdb := redisServer.Client(b)
	s := New(rdb)
	big := quota.Amounts{quota.Servers: 1 << 40, quota.CPUs: 1 << 40, quota.MemoryGiB: 1 << 40, quota.GPUs: 1 << 40, quota.PublicIPs: 1 << 40}
	i := 0
	for b.Loop() {
		inst := newInstance("acme", "web", fmt.Sprint("n", i))
		if r, err := s.Create(ctx, inst, inst.Name, big, instance.Idempotency{}); err != nil || r != nil {
			b.Fatal(err, r)
		}
		i++
	}
}

func BenchmarkUpdateSpec(b *testing.B) {
	rdb := redisServer.Client(b)
	s := New(rdb)
	inst := newInstance("acme", "web", "a")
	if r, err := s.Create(ctx, inst, "c", roomy, instance.Idempotency{}); err != nil || r != nil {
		b.Fatal(err, r)
	}
	inst.Generation = 1
	for b.Loop() {
		if r, err := s.UpdateSpec(ctx, inst, nil, roomy, nil, nil, instance.Idempotency{}); err != nil || r != nil {
			b.Fatal(err, r)
		}
		inst.Generation++
	}
}

func BenchmarkGet(b *testing.B) {
	rdb := redisServer.Client(b)
	s := New(rdb)
	inst := newInstance("acme", "web", "a")
	if r, err := s.Create(ctx, inst, "c", roomy, instance.Idempotency{}); err != nil || r != nil {
		b.Fatal(err, r)
	}
	for b.Loop() {
		if _, err := s.Get(ctx, []string{"acme"}, inst.ID); err != nil {
			b.Fatal(err)
		}
	}
}

func TestExists(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	inst := newInstance("acme", "web", "a")
	if ok, err := s.Exists(ctx, "acme", inst.ID); err != nil || ok {
		t.Fatalf("before create: %v %v", ok, err)
	}
	if r, err := s.Create(ctx, inst, "c", roomy, instance.Idempotency{}); err != nil || r != nil {
		t.Fatal(err, r)
	}
	if ok, err := s.Exists(ctx, "acme", inst.ID); err != nil || !ok {
		t.Errorf("after create: %v %v", ok, err)
	}
	if ok, _ := s.Exists(ctx, "globex", inst.ID); ok {
		t.Error("exists in another organization")
	}
}
