package store

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/quota"
)

// snapshot renders every key of the database with its contents, to prove a call changed
// nothing.
func snapshot(t *testing.T, rdb *redis.Client) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, key := range rdb.Keys(ctx, "*").Val() {
		switch typ := rdb.Type(ctx, key).Val(); typ {
		case "string":
			out[key] = rdb.Get(ctx, key).Val()
		case "hash":
			out[key] = fmt.Sprint(hgetall(t, rdb, key))
		case "zset":
			out[key] = fmt.Sprint(rdb.ZRange(ctx, key, 0, -1).Val())
		case "stream":
			out[key] = fmt.Sprint(rdb.XRange(ctx, key, "-", "+").Val())
		default:
			t.Fatalf("%s has unexpected type %s", key, typ)
		}
	}
	return out
}

// create stores inst with Create under its real name claim and returns it as stored.
func create(t testing.TB, s *Store, inst *instance.Instance) *instance.Instance {
	t.Helper()
	if r, err := s.Create(ctx, inst, instance.NameClaim(inst.NetworkID, inst.Name), roomy, instance.Idempotency{}); err != nil || r != nil {
		t.Fatal(err, r)
	}
	got, err := s.Get(ctx, []string{inst.OrganizationID}, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestWriteStatus(t *testing.T) {
	const spec = `{"name":"a"}`
	oldStatus := `{"provisioningStatus":"PENDING"}`
	status := instance.Status{ProvisioningStatus: instance.ProvisioningProvisioned, PowerState: instance.PowerRunning, ObservedGeneration: 2}
	newStatus, _ := json.Marshal(&status)
	seed := map[string]string{"spec": spec, "status": oldStatus, "gen": "2", "sv": "5", "proj": "web"}
	tests := []struct {
		name        string
		init        map[string]string // instance hash before; nil for none
		gen, sv     int64             // what the writer read
		wantWritten bool
		want        map[string]string // instance hash after; nil for none
	}{
		{name: "status version matches", init: seed, gen: 2, sv: 5, wantWritten: true,
			want: map[string]string{"spec": spec, "status": string(newStatus), "gen": "2", "sv": "6", "proj": "web"}},
		{name: "generation changed since the read", init: seed, gen: 1, sv: 5, wantWritten: true,
			want: map[string]string{"spec": spec, "status": string(newStatus), "gen": "2", "sv": "6", "proj": "web"}},
		{name: "status version moved on", init: seed, gen: 2, sv: 4, want: seed},
		{name: "status version from the future", init: seed, gen: 2, sv: 6, want: seed},
		{name: "instance gone", gen: 2, sv: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb := redisServer.Client(t)
			key := instanceKey("acme", "i-1")
			if tt.init != nil {
				rdb.HSet(ctx, key, tt.init)
			}
			inst := &instance.Instance{ID: "i-1", OrganizationID: "acme", ProjectID: "web", Generation: tt.gen, StatusVersion: tt.sv}
			written, err := New(rdb).WriteStatus(ctx, inst, status, statusEvent)
			if err != nil {
				t.Fatal(err)
			}
			if written != tt.wantWritten {
				t.Errorf("written = %v, want %v", written, tt.wantWritten)
			}
			if tt.want == nil {
				if n := rdb.DBSize(ctx).Val(); n != 0 {
					t.Errorf("%d keys written: %v", n, rdb.Keys(ctx, "*").Val())
				}
				return
			}
			if h := hgetall(t, rdb, key); !reflect.DeepEqual(h, tt.want) {
				t.Errorf("instance hash = %v\nwant %v", h, tt.want)
			}
		})
	}
}

func TestForgetReleasesAndDeletesEverything(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	gone := newInstance("acme", "web", "a")
	gone.Charge = quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.PublicIPs: 1}
	gone = create(t, s, gone)
	kept := create(t, s, newInstance("acme", "web", "b"))
	create(t, s, newInstance("globex", "web", "a"))
	if _, err := s.SetLimits(ctx, "acme", quota.Amounts{quota.Servers: 10}, instance.Idempotency{}); err != nil {
		t.Fatal(err)
	}
	globexBefore := snapshot(t, rdb)
	for key := range globexBefore {
		if hashTag(key) != "o:globex" {
			delete(globexBefore, key)
		}
	}

	forgotten, err := s.Forget(ctx, gone, eventTime)
	if err != nil || !forgotten {
		t.Fatalf("forget = %v, %v", forgotten, err)
	}
	if n := rdb.Exists(ctx, instanceKey("acme", gone.ID), claimKey("acme", instance.NameClaim(gone.NetworkID, "a"))).Val(); n != 0 {
		t.Errorf("%d of the instance hash and its claim left", n)
	}
	if got := rdb.Get(ctx, claimKey("acme", instance.NameClaim(kept.NetworkID, "b"))).Val(); got != kept.ID {
		t.Errorf("other claim holds %q, want %q", got, kept.ID)
	}
	for _, key := range []string{orgIndexKey("acme"), projectIndexKey("acme", "web")} {
		if members := rdb.ZRange(ctx, key, 0, -1).Val(); !reflect.DeepEqual(members, []string{kept.ID}) {
			t.Errorf("%s = %v, want only %s", key, members, kept.ID)
		}
	}
	// b still holds servers 1, cpus 2; a released all it held, publicIPs down to 0.
	wantQuota := map[string]string{"limit:servers": "10", "used:servers": "1", "used:cpus": "2", "used:publicIPs": "0"}
	if q := hgetall(t, rdb, quotaKey("acme")); !reflect.DeepEqual(q, wantQuota) {
		t.Errorf("quota = %v\nwant %v", q, wantQuota)
	}
	globexAfter := snapshot(t, rdb)
	for key := range globexAfter {
		if hashTag(key) != "o:globex" {
			delete(globexAfter, key)
		}
	}
	if !reflect.DeepEqual(globexAfter, globexBefore) {
		t.Errorf("other organization changed:\n%v\n->\n%v", globexBefore, globexAfter)
	}
}

func TestForgetLeavesAClaimOfAnotherInstance(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	inst := create(t, s, newInstance("acme", "web", "a"))
	claim := claimKey("acme", instance.NameClaim(inst.NetworkID, inst.Name))
	rdb.Set(ctx, claim, "other-id", 0)
	if forgotten, err := s.Forget(ctx, inst, eventTime); err != nil || !forgotten {
		t.Fatalf("forget = %v, %v", forgotten, err)
	}
	if got := rdb.Get(ctx, claim).Val(); got != "other-id" {
		t.Errorf("claim holds %q, want other-id", got)
	}
	if n := rdb.Exists(ctx, instanceKey("acme", inst.ID)).Val(); n != 0 {
		t.Error("instance hash left")
	}
}

func TestForgetRefusalsChangeNothing(t *testing.T) {
	tests := []struct {
		name   string
		modify func(t *testing.T, s *Store, inst *instance.Instance) // after the read, before Forget
		gen    int64                                                 // the generation Forget is given
	}{
		{name: "generation moved on", gen: 1, modify: func(t *testing.T, s *Store, inst *instance.Instance) {
			changed := *inst
			changed.Description = "changed"
			if r, err := s.UpdateSpec(ctx, &changed, nil, roomy, nil, nil, instance.Idempotency{}); err != nil || r != nil {
				t.Fatal(err, r)
			}
		}},
		{name: "generation from the future", gen: 2},
		{name: "already forgotten", gen: 1, modify: func(t *testing.T, s *Store, inst *instance.Instance) {
			if forgotten, err := s.Forget(ctx, inst, eventTime); err != nil || !forgotten {
				t.Fatal(forgotten, err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb := redisServer.Client(t)
			s := New(rdb)
			inst := create(t, s, newInstance("acme", "web", "a"))
			create(t, s, newInstance("acme", "web", "b"))
			if tt.modify != nil {
				tt.modify(t, s, inst)
			}
			before := snapshot(t, rdb)
			inst.Generation = tt.gen
			forgotten, err := s.Forget(ctx, inst, eventTime)
			if err != nil || forgotten {
				t.Fatalf("forget = %v, %v", forgotten, err)
			}
			if after := snapshot(t, rdb); !reflect.DeepEqual(after, before) {
				t.Errorf("state changed:\n%v\n->\n%v", before, after)
			}
		})
	}
}

func TestForgetIsIdempotentAndFreesTheName(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	inst := create(t, s, newInstance("acme", "web", "a"))
	for i, want := range []bool{true, false, false} {
		forgotten, err := s.Forget(ctx, inst, eventTime)
		if err != nil || forgotten != want {
			t.Fatalf("forget #%d = %v, %v; want %v", i+1, forgotten, err, want)
		}
	}
	if _, used, err := s.Quota(ctx, "acme"); err != nil || !reflect.DeepEqual(used, quota.Amounts{quota.Servers: 0, quota.CPUs: 0}) {
		t.Errorf("used = %v, %v; want servers and cpus released once", used, err)
	}
	again := create(t, s, newInstance("acme", "web", "a"))
	if got := rdb.Get(ctx, claimKey("acme", instance.NameClaim(again.NetworkID, "a"))).Val(); got != again.ID {
		t.Errorf("claim holds %q, want %q", got, again.ID)
	}
	if _, used, err := s.Quota(ctx, "acme"); err != nil || !reflect.DeepEqual(used, quota.Amounts{quota.Servers: 1, quota.CPUs: 2}) {
		t.Errorf("used = %v, %v", used, err)
	}
}

func BenchmarkWriteStatus(b *testing.B) {
	rdb := redisServer.Client(b)
	s := New(rdb)
	inst := create(b, s, newInstance("acme", "web", "a"))
	status := instance.Status{ProvisioningStatus: instance.ProvisioningProvisioned, PowerState: instance.PowerRunning, HealthStatus: instance.HealthHealthy}
	for b.Loop() {
		if written, err := s.WriteStatus(ctx, inst, status, statusEvent); err != nil || !written {
			b.Fatal(written, err)
		}
		inst.StatusVersion++
	}
}

func BenchmarkForget(b *testing.B) {
	rdb := redisServer.Client(b)
	s := New(rdb)
	i := 0
	for b.Loop() {
		b.StopTimer()
		inst := create(b, s, newInstance("acme", "web", fmt.Sprint("n", i)))
		i++
		b.StartTimer()
		if forgotten, err := s.Forget(ctx, inst, eventTime); err != nil || !forgotten {
			b.Fatal(forgotten, err)
		}
	}
}

var (
	eventTime   = time.Date(2026, 11, 21, 12, 30, 0, 0, time.UTC)
	statusEvent = instance.Event{Kind: instance.EventStatusChanged, Changed: []string{"status.powerState"}, At: eventTime}
)
