package sim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/computeql/computeql/region"
)

var macPattern = regexp.MustCompile(`^fa:16:3e(:[0-9a-f]{2}){3}$`)

var publicRange = netip.MustParsePrefix("100.64.0.0/10")

// TestLifecycle follows a server step by step on an injected clock: created PENDING with its
// addresses, BUILDING at the next tick, still BUILDING a millisecond before BuildDelay has
// passed, RUNNING and HEALTHY once it has, each step one event carrying id, tags and scope.
func TestLifecycle(t *testing.T) {
	const buildDelay = 90 * time.Second
	cases := []struct {
		name     string
		network  string
		publicIP bool
	}{
		{"private only", "net-acme-web-eu", false},
		{"with public IP", "net-globex-prod-us", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			clk := newFakeClock()
			s := e.sim(Options{BuildDelay: buildDelay, Now: clk.Now})
			events := e.watch(s, "0-0")
			ctx := context.Background()

			sp := spec(t, tc.network, "web-1", "inst-1")
			sp.Networking.PublicIP = tc.publicIP
			srv, err := s.CreateServer(ctx, sp)
			if err != nil {
				t.Fatalf("CreateServer: %v", err)
			}
			if srv.ID == "" || srv.State != region.ServerPending || srv.Health != region.HealthUnknown {
				t.Errorf("created server: id %q state %s health %s, want an id, PENDING, UNKNOWN", srv.ID, srv.State, srv.Health)
			}
			network, _ := region.Demo().Network(tc.network)
			checkPrivateIP(t, network.Prefix, srv.PrivateIP)
			if !macPattern.MatchString(srv.MAC) {
				t.Errorf("MAC %q does not look like fa:16:3e:xx:xx:xx", srv.MAC)
			}
			if tc.publicIP {
				if a, err := netip.ParseAddr(srv.PublicIP); err != nil || !publicRange.Contains(a) {
					t.Errorf("public IP %q, want an address of %s", srv.PublicIP, publicRange)
				}
			} else if srv.PublicIP != "" {
				t.Errorf("public IP %q without Networking.PublicIP", srv.PublicIP)
			}
			if !srv.CreatedAt.Equal(clk.Now()) {
				t.Errorf("CreatedAt %v, want the injected now %v", srv.CreatedAt, clk.Now())
			}
			if got := e.mustGet(t, s, srv.ID); got.State != region.ServerPending || got.PrivateIP != srv.PrivateIP || got.MAC != srv.MAC {
				t.Errorf("stored server %+v differs from the one returned %+v", got, srv)
			}

			e.run(s)
			steps := []struct {
				advance    time.Duration
				wantState  region.ServerState
				wantHealth region.ServerHealth
				wantEvents int64
			}{
				{0, region.ServerBuilding, region.HealthUnknown, 2},
				{buildDelay - time.Millisecond, region.ServerBuilding, region.HealthUnknown, 2},
				{time.Millisecond, region.ServerRunning, region.HealthHealthy, 3},
				{time.Hour, region.ServerRunning, region.HealthHealthy, 3}, // settled: no more events
			}
			for i, st := range steps {
				clk.Add(st.advance)
				clk.tick(t)
				got := e.mustGet(t, s, srv.ID)
				if got.State != st.wantState || got.Health != st.wantHealth {
					t.Fatalf("step %d (+%s): state %s health %s, want %s %s", i, st.advance, got.State, got.Health, st.wantState, st.wantHealth)
				}
				if got.PrivateIP != srv.PrivateIP || got.MAC != srv.MAC || got.PublicIP != srv.PublicIP {
					t.Errorf("step %d: addresses changed: %+v, want those of %+v", i, got, srv)
				}
				if n := e.eventCount(t); n != st.wantEvents {
					t.Fatalf("step %d: %d events recorded, want %d", i, n, st.wantEvents)
				}
			}

			wantKinds := []region.EventKind{region.ServerCreated, region.ServerUpdated, region.ServerUpdated}
			last := "0-0"
			for i, kind := range wantKinds {
				ev := next(t, events)
				if ev.Kind != kind || ev.ServerID != srv.ID {
					t.Errorf("event %d: %s of %s, want %s of %s", i, ev.Kind, ev.ServerID, kind, srv.ID)
				}
				if !maps.Equal(ev.Tags, sp.Tags) || ev.Scope != sp.Scope {
					t.Errorf("event %d: tags %v scope %+v, want %v %+v", i, ev.Tags, ev.Scope, sp.Tags, sp.Scope)
				}
				if !cursorLess(t, last, ev.Cursor) {
					t.Errorf("event %d: cursor %s not after %s", i, ev.Cursor, last)
				}
				last = ev.Cursor
			}
		})
	}
}

// TestBuildTakesBuildDelay checks on the real clock that a server runs no sooner than
// BuildDelay after it was created (a lower bound only: an upper one would be flaky).
func TestBuildTakesBuildDelay(t *testing.T) {
	const buildDelay = 150 * time.Millisecond
	e := newEnv(t)
	s := e.sim(Options{BuildDelay: buildDelay})
	e.run(s)
	start := time.Now()
	srv, err := s.CreateServer(context.Background(), spec(t, "net-acme-web-eu", "web-1", "inst-1"))
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	e.waitState(t, s, srv.ID, region.ServerBuilding)
	got := e.waitState(t, s, srv.ID, region.ServerRunning)
	// Due times are kept in milliseconds, so a transition may come up to 1ms early.
	if took := time.Since(start); took < buildDelay-time.Millisecond {
		t.Errorf("RUNNING after %s, want at least BuildDelay %s", took, buildDelay)
	}
	if got.Health != region.HealthHealthy {
		t.Errorf("health %s, want HEALTHY", got.Health)
	}
}

// TestPrivateIPsUniqueUnderConcurrentCreates creates 50 servers on one network at once: every
// create succeeds (losing an optimistic transaction to a neighbour is not the caller's error)
// and no two servers share an address.
func TestPrivateIPsUniqueUnderConcurrentCreates(t *testing.T) {
	const n = 50
	e := newEnv(t)
	s := e.sim(Options{})
	network, _ := region.Demo().Network("net-acme-web-eu")
	var wg sync.WaitGroup
	servers := make([]region.Server, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			servers[i], errs[i] = s.CreateServer(context.Background(), spec(t, network.ID, "web", fmt.Sprintf("inst-%d", i)))
		})
	}
	wg.Wait()
	seen := map[string]string{}
	for i, srv := range servers {
		if errs[i] != nil {
			t.Errorf("create %d: %v", i, errs[i])
			continue
		}
		checkPrivateIP(t, network.Prefix, srv.PrivateIP)
		if other, dup := seen[srv.PrivateIP]; dup {
			t.Errorf("servers %s and %s share private IP %s", other, srv.ID, srv.PrivateIP)
		}
		seen[srv.PrivateIP] = srv.ID
		if got := e.mustGet(t, s, srv.ID); got.PrivateIP != srv.PrivateIP {
			t.Errorf("server %s stored with IP %s, returned with %s", srv.ID, got.PrivateIP, srv.PrivateIP)
		}
	}
	// Addresses are per network: another network starts from its own first usable address.
	other, err := s.CreateServer(context.Background(), spec(t, "net-acme-data-eu", "data", "inst-data"))
	if err != nil {
		t.Fatalf("create on another network: %v", err)
	}
	if other.PrivateIP != "10.20.0.10" {
		t.Errorf("first server of net-acme-data-eu got %s, want 10.20.0.10", other.PrivateIP)
	}
}

// TestPrivateIPsExhaustedAndReused fills a /28 (five usable addresses), sees the sixth create
// refused without a trace, deletes one server and gets its address back.
func TestPrivateIPsExhaustedAndReused(t *testing.T) {
	e := newEnv(t)
	s := e.sim(Options{Catalog: tinyCatalog(t)})
	e.run(s)
	ctx := context.Background()
	want := []string{"192.168.5.10", "192.168.5.11", "192.168.5.12", "192.168.5.13", "192.168.5.14"}
	var got []string
	var ids []string
	for i := range want {
		srv, err := s.CreateServer(ctx, specOn("tiny", fmt.Sprintf("inst-%d", i)))
		if err != nil {
			t.Fatalf("create %d of %d: %v", i+1, len(want), err)
		}
		got = append(got, srv.PrivateIP)
		ids = append(ids, srv.ID)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("addresses %v, want %v", got, want)
	}
	if srv, err := s.CreateServer(ctx, specOn("tiny", "inst-full")); err == nil {
		t.Fatalf("sixth create on a full /28 succeeded with %s", srv.PrivateIP)
	}
	if found, err := s.FindServers(ctx, specOn("tiny", "").Scope, region.InstanceTag, "inst-full"); err != nil || len(found) != 0 {
		t.Errorf("refused create left servers %v (err %v)", found, err)
	}
	// The clock's transitions of the five may be recorded meanwhile; a creation may not.
	events, err := e.rdb.XRange(ctx, eventsKey, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	created := 0
	for _, m := range events {
		if m.Values["kind"] == string(region.ServerCreated) {
			created++
		}
	}
	if created != len(want) {
		t.Errorf("%d created events, want %d: the refused create left one", created, len(want))
	}

	freed := e.mustGet(t, s, ids[2]).PrivateIP
	if err := s.DeleteServer(ctx, ids[2]); err != nil {
		t.Fatalf("DeleteServer: %v", err)
	}
	e.waitGone(t, s, ids[2])
	srv, err := s.CreateServer(ctx, specOn("tiny", "inst-again"))
	if err != nil {
		t.Fatalf("create after a delete: %v", err)
	}
	if srv.PrivateIP != freed {
		t.Errorf("create after delete got %s, want the freed %s", srv.PrivateIP, freed)
	}
}

// TestFindServers looks servers up by tag within an exact scope: a server of another scope with
// the same tag value is not returned, and each field of the scope counts.
func TestFindServers(t *testing.T) {
	e := newEnv(t)
	s := e.sim(Options{})
	ctx := context.Background()
	create := func(network, inst string) region.Server {
		t.Helper()
		srv, err := s.CreateServer(ctx, spec(t, network, "srv", inst))
		if err != nil {
			t.Fatalf("CreateServer: %v", err)
		}
		return srv
	}
	webA := create("net-acme-web-eu", "i-1")
	dataA := create("net-acme-data-eu", "i-1") // same tag value, another project and network
	webB := create("net-acme-web-eu", "i-2")
	web := scopeOf(t, region.Demo(), "net-acme-web-eu")
	data := scopeOf(t, region.Demo(), "net-acme-data-eu")
	with := func(f func(*region.Scope)) region.Scope { sc := web; f(&sc); return sc }

	cases := []struct {
		name       string
		scope      region.Scope
		tag, value string
		want       []string
	}{
		{"instance in its scope", web, region.InstanceTag, "i-1", []string{webA.ID}},
		{"same value in another project", data, region.InstanceTag, "i-1", []string{dataA.ID}},
		{"another instance", web, region.InstanceTag, "i-2", []string{webB.ID}},
		{"any tag is indexed", web, "team", "web", []string{webA.ID, webB.ID}},
		{"unknown value", web, region.InstanceTag, "i-3", nil},
		{"unknown tag", web, "nope", "i-1", nil},
		{"other organization", with(func(sc *region.Scope) { sc.OrganizationID = "globex" }), region.InstanceTag, "i-1", nil},
		{"other project", with(func(sc *region.Scope) { sc.ProjectID = "data" }), region.InstanceTag, "i-1", nil},
		{"other region", with(func(sc *region.Scope) { sc.RegionID = "us-east" }), region.InstanceTag, "i-1", nil},
		{"other network", with(func(sc *region.Scope) { sc.NetworkID = "net-acme-web-us" }), region.InstanceTag, "i-1", nil},
		{"empty scope", region.Scope{}, region.InstanceTag, "i-1", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			found, err := s.FindServers(ctx, tc.scope, tc.tag, tc.value)
			if err != nil {
				t.Fatalf("FindServers: %v", err)
			}
			var ids []string
			for _, srv := range found {
				ids = append(ids, srv.ID)
				if srv.Tags[tc.tag] != tc.value || srv.Scope != tc.scope {
					t.Errorf("found %s with tags %v scope %+v", srv.ID, srv.Tags, srv.Scope)
				}
			}
			slices.Sort(ids)
			want := slices.Sorted(slices.Values(tc.want))
			if !slices.Equal(ids, want) {
				t.Errorf("found %v, want %v", ids, want)
			}
		})
	}

	// The lookup is an index: the tag's set names exactly the servers carrying it.
	members, err := e.rdb.SMembers(ctx, tagKey(region.InstanceTag, "i-1")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Sort(members); !slices.Equal(members, slices.Sorted(slices.Values([]string{webA.ID, dataA.ID}))) {
		t.Errorf("tag index holds %v, want %s and %s", members, webA.ID, dataA.ID)
	}

	// A deleted server is found (DELETING) until the clock removes it, then neither found nor
	// indexed.
	if err := s.DeleteServer(ctx, webA.ID); err != nil {
		t.Fatalf("DeleteServer: %v", err)
	}
	found, err := s.FindServers(ctx, web, region.InstanceTag, "i-1")
	if err != nil || len(found) != 1 || found[0].State != region.ServerDeleting {
		t.Fatalf("right after delete: found %+v (err %v), want the server DELETING", found, err)
	}
	e.run(s)
	e.waitGone(t, s, webA.ID)
	if found, err := s.FindServers(ctx, web, region.InstanceTag, "i-1"); err != nil || len(found) != 0 {
		t.Errorf("after deletion: found %+v (err %v), want nothing", found, err)
	}
	if ok, _ := e.rdb.SIsMember(ctx, tagKey(region.InstanceTag, "i-1"), webA.ID).Result(); ok {
		t.Errorf("deleted server still in the tag index")
	}
	if found, err := s.FindServers(ctx, data, region.InstanceTag, "i-1"); err != nil || len(found) != 1 {
		t.Errorf("the other scope's server: found %+v (err %v), want it still", found, err)
	}
}

// TestUpdateNetworking changes networking in place: same server, MAC and private IP; the public
// IP comes and goes with the flag and is kept while it stays on; every update is an event.
func TestUpdateNetworking(t *testing.T) {
	e := newEnv(t)
	s := e.sim(Options{}) // no clock: the server stays PENDING and the only events are ours
	ctx := context.Background()
	created, err := s.CreateServer(ctx, spec(t, "net-acme-web-eu", "web-1", "inst-1"))
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	events := e.watch(s, "0-0")
	if ev := next(t, events); ev.Kind != region.ServerCreated {
		t.Fatalf("first event %s, want created", ev.Kind)
	}

	steps := []struct {
		name       string
		networking region.ServerNetworking
		// wantPublic: "" none, "new" a fresh one, "same" the previous one.
		wantPublic string
	}{
		{"security groups and sources", region.ServerNetworking{
			SecurityGroupIDs: []string{"sg-acme-web-eu-ssh", "sg-acme-web-eu-web"}, AllowedSourceAddresses: []string{"0.0.0.0/0"}}, ""},
		{"public IP on", region.ServerNetworking{SecurityGroupIDs: []string{"sg-acme-web-eu-web"}, PublicIP: true}, "new"},
		{"public IP kept", region.ServerNetworking{SecurityGroupIDs: []string{"sg-acme-web-eu-ssh"}, PublicIP: true}, "same"},
		{"public IP off", region.ServerNetworking{}, ""},
		{"public IP on again", region.ServerNetworking{PublicIP: true}, "new"},
	}
	public := ""
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			got, err := s.UpdateNetworking(ctx, created.ID, st.networking)
			if err != nil {
				t.Fatalf("UpdateNetworking: %v", err)
			}
			stored := e.mustGet(t, s, created.ID)
			for _, srv := range []region.Server{got, stored} {
				if srv.ID != created.ID || srv.MAC != created.MAC || srv.PrivateIP != created.PrivateIP || !srv.CreatedAt.Equal(created.CreatedAt) {
					t.Errorf("server not changed in place: %+v, was %+v", srv, created)
				}
				if !slices.Equal(srv.Networking.SecurityGroupIDs, st.networking.SecurityGroupIDs) ||
					!slices.Equal(srv.Networking.AllowedSourceAddresses, st.networking.AllowedSourceAddresses) ||
					srv.Networking.PublicIP != st.networking.PublicIP {
					t.Errorf("networking %+v, want %+v", srv.Networking, st.networking)
				}
			}
			if stored.PublicIP != got.PublicIP {
				t.Errorf("stored public IP %q, returned %q", stored.PublicIP, got.PublicIP)
			}
			switch st.wantPublic {
			case "":
				if got.PublicIP != "" {
					t.Errorf("public IP %q, want none", got.PublicIP)
				}
			case "same":
				if got.PublicIP != public {
					t.Errorf("public IP %q, want the kept %q", got.PublicIP, public)
				}
			case "new":
				if a, err := netip.ParseAddr(got.PublicIP); err != nil || !publicRange.Contains(a) || got.PublicIP == public {
					t.Errorf("public IP %q, want a new address of %s (previous %q)", got.PublicIP, publicRange, public)
				}
			}
			public = got.PublicIP
			ev := next(t, events)
			if ev.Kind != region.ServerUpdated || ev.ServerID != created.ID || ev.Tags[region.InstanceTag] != "inst-1" {
				t.Errorf("event %+v, want updated of %s with its tags", ev, created.ID)
			}
		})
	}

	if _, err := s.UpdateNetworking(ctx, "no-such-server", region.ServerNetworking{}); !errors.Is(err, region.ErrServerNotFound) {
		t.Errorf("update of an unknown server: %v, want ErrServerNotFound", err)
	}
	if err := s.DeleteServer(ctx, created.ID); err != nil {
		t.Fatalf("DeleteServer: %v", err)
	}
	before := e.eventCount(t)
	deleting := e.mustGet(t, s, created.ID)
	if _, err := s.UpdateNetworking(ctx, created.ID, region.ServerNetworking{SecurityGroupIDs: []string{"sg-x"}}); err == nil {
		t.Errorf("update of a DELETING server accepted")
	}
	if got := e.mustGet(t, s, created.ID); got.State != region.ServerDeleting || got.PublicIP != deleting.PublicIP ||
		!slices.Equal(got.Networking.SecurityGroupIDs, deleting.Networking.SecurityGroupIDs) {
		t.Errorf("refused update changed the server: %+v, was %+v", got, deleting)
	}
	if after := e.eventCount(t); after != before {
		t.Errorf("refused update recorded %d events", after-before)
	}
}

// TestConcurrentUpdates: updates of one server racing each other and the clock all succeed
// (losing an optimistic transaction is retried, not reported), each recorded once.
func TestConcurrentUpdates(t *testing.T) {
	const writers, each = 4, 10
	e := newEnv(t)
	s := e.sim(Options{BuildDelay: 20 * time.Millisecond})
	ctx := context.Background()
	srv, err := s.CreateServer(ctx, spec(t, "net-acme-web-eu", "web-1", "inst-1"))
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	e.run(s)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				n := region.ServerNetworking{SecurityGroupIDs: []string{fmt.Sprintf("sg-%d-%d", w, i)}, PublicIP: i%2 == 0}
				if _, err := s.UpdateNetworking(ctx, srv.ID, n); err != nil {
					t.Errorf("UpdateNetworking: %v", err)
				}
			}
		})
	}
	wg.Wait()
	e.waitState(t, s, srv.ID, region.ServerRunning)
	if n, want := e.eventCount(t), int64(3+writers*each); n != want {
		t.Errorf("%d events, want %d: creation, two transitions and every update", n, want)
	}
}

// TestUpdateNetworkingKeepsSchedule: changing networking or health while a server builds must
// not cut its build short.
func TestUpdateNetworkingKeepsSchedule(t *testing.T) {
	const buildDelay = time.Minute
	e := newEnv(t)
	clk := newFakeClock()
	s := e.sim(Options{BuildDelay: buildDelay, Now: clk.Now})
	ctx := context.Background()
	srv, err := s.CreateServer(ctx, spec(t, "net-acme-web-eu", "web-1", "inst-1"))
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	e.run(s)
	clk.tick(t)
	e.waitState(t, s, srv.ID, region.ServerBuilding)
	clk.Add(buildDelay / 2)
	if _, err := s.UpdateNetworking(ctx, srv.ID, region.ServerNetworking{PublicIP: true}); err != nil {
		t.Fatalf("UpdateNetworking: %v", err)
	}
	if err := s.SetHealth(ctx, srv.ID, region.HealthDegraded); err != nil {
		t.Fatalf("SetHealth: %v", err)
	}
	clk.tick(t)
	if got := e.mustGet(t, s, srv.ID); got.State != region.ServerBuilding {
		t.Fatalf("half way through the build, after an update: %s, want BUILDING", got.State)
	}
	if n := e.eventCount(t); n != 4 { // created, BUILDING, networking, health
		t.Errorf("%d events, want 4", n)
	}
	clk.Add(buildDelay / 2)
	clk.tick(t)
	if got := e.mustGet(t, s, srv.ID); got.State != region.ServerRunning || got.PublicIP == "" {
		t.Errorf("after BuildDelay: %s with public IP %q, want RUNNING with one", got.State, got.PublicIP)
	}
}

// TestDeleteServer: DELETING at once, still there until DeleteDelay has passed (deleting again
// meanwhile changes nothing), then gone with a deleted event and its address released.
func TestDeleteServer(t *testing.T) {
	const deleteDelay = 30 * time.Second
	e := newEnv(t)
	clk := newFakeClock()
	s := e.sim(Options{DeleteDelay: deleteDelay, Now: clk.Now})
	ctx := context.Background()
	srv, err := s.CreateServer(ctx, spec(t, "net-acme-web-eu", "web-1", "inst-1"))
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	e.run(s)
	clk.tick(t) // BUILDING
	clk.tick(t) // RUNNING: BuildDelay is zero
	e.waitState(t, s, srv.ID, region.ServerRunning)
	events := e.watch(s, "0-0")
	for range 3 { // created, BUILDING, RUNNING
		next(t, events)
	}

	if err := s.DeleteServer(ctx, srv.ID); err != nil {
		t.Fatalf("DeleteServer: %v", err)
	}
	if got := e.mustGet(t, s, srv.ID); got.State != region.ServerDeleting {
		t.Fatalf("right after DeleteServer: %s, want DELETING", got.State)
	}
	if ev := next(t, events); ev.Kind != region.ServerUpdated || ev.ServerID != srv.ID {
		t.Errorf("event %+v, want updated (DELETING) of %s", ev, srv.ID)
	}
	before := e.eventCount(t)

	clk.Add(deleteDelay / 2)
	clk.tick(t)
	// Deleting again is no error, records nothing and does not put the deletion off.
	if err := s.DeleteServer(ctx, srv.ID); err != nil {
		t.Errorf("second DeleteServer: %v", err)
	}
	if after := e.eventCount(t); after != before {
		t.Errorf("deleting a DELETING server recorded %d events", after-before)
	}
	clk.Add(deleteDelay/2 - time.Millisecond)
	clk.tick(t)
	if got := e.mustGet(t, s, srv.ID); got.State != region.ServerDeleting {
		t.Fatalf("a millisecond before DeleteDelay: %s, want DELETING", got.State)
	}
	clk.Add(time.Millisecond)
	clk.tick(t)
	if _, err := e.get(t, s, srv.ID); !errors.Is(err, region.ErrServerNotFound) {
		t.Fatalf("after DeleteDelay: %v, want the server gone", err)
	}
	ev := next(t, events)
	if ev.Kind != region.ServerDeleted || ev.ServerID != srv.ID || ev.Tags[region.InstanceTag] != "inst-1" || ev.Scope != srv.Scope {
		t.Errorf("event %+v, want deleted of %s with its tags and scope", ev, srv.ID)
	}
	if n, _ := e.rdb.ZCard(ctx, dueKey).Result(); n != 0 {
		t.Errorf("%d transitions still due", n)
	}

	for _, id := range []string{srv.ID, "never-existed"} {
		if err := s.DeleteServer(ctx, id); err != nil {
			t.Errorf("DeleteServer(%s) of a server that is gone: %v", id, err)
		}
	}
	if n := e.eventCount(t); n != before+1 {
		t.Errorf("deleting servers that are gone recorded events: %d in all, want %d", n, before+1)
	}
	// The address was released: the next server of the network gets it.
	again, err := s.CreateServer(ctx, spec(t, "net-acme-web-eu", "web-2", "inst-2"))
	if err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	if again.PrivateIP != srv.PrivateIP {
		t.Errorf("next server got %s, want the released %s", again.PrivateIP, srv.PrivateIP)
	}
}

// TestWatch covers where a watch starts and how it ends.
func TestWatch(t *testing.T) {
	ctx := context.Background()
	createN := func(t *testing.T, s *Sim, n int) {
		t.Helper()
		for i := range n {
			if _, err := s.CreateServer(ctx, spec(t, "net-acme-web-eu", "w", fmt.Sprintf("i-%d", i))); err != nil {
				t.Fatalf("CreateServer: %v", err)
			}
		}
	}

	t.Run("resumes after a cursor", func(t *testing.T) {
		e := newEnv(t)
		s := e.sim(Options{})
		createN(t, s, 4)
		all := e.watch(s, "0-0")
		var first []region.Event
		for range 4 {
			first = append(first, next(t, all))
		}
		resumed := e.watch(s, first[1].Cursor)
		createN(t, s, 1)
		newest := next(t, all)
		want := append(slices.Clone(first[2:]), newest)
		for i, w := range want {
			got := next(t, resumed)
			if got.Cursor != w.Cursor || got.ServerID != w.ServerID || got.Kind != w.Kind {
				t.Errorf("resumed event %d: %+v, want %+v", i, got, w)
			}
		}
		createN(t, s, 1)
		latest := next(t, all)
		if got := next(t, resumed); got.Cursor != latest.Cursor {
			t.Errorf("after the backlog: %s, want %s (no gap, no duplicate)", got.Cursor, latest.Cursor)
		}
	})

	t.Run("empty cursor starts from now", func(t *testing.T) {
		e := newEnv(t)
		s := e.sim(Options{})
		createN(t, s, 3)
		fresh := e.watch(s, "")
		e.waitBlockedWatch(t, 1)
		srv, err := s.CreateServer(ctx, spec(t, "net-acme-web-eu", "w", "later"))
		if err != nil {
			t.Fatalf("CreateServer: %v", err)
		}
		if ev := next(t, fresh); ev.ServerID != srv.ID || ev.Kind != region.ServerCreated {
			t.Errorf("first event %+v, want the creation of %s (no replay)", ev, srv.ID)
		}
	})

	t.Run("empty cursor on an empty stream", func(t *testing.T) {
		e := newEnv(t)
		s := e.sim(Options{})
		fresh := e.watch(s, "")
		e.waitBlockedWatch(t, 1)
		createN(t, s, 1)
		if ev := next(t, fresh); ev.Kind != region.ServerCreated {
			t.Errorf("first event %+v, want a creation", ev)
		}
	})

	t.Run("returns when ctx ends", func(t *testing.T) {
		e := newEnv(t)
		s := e.sim(Options{})
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- s.Watch(wctx, "", func(region.Event) error { return nil }) }()
		e.waitBlockedWatch(t, 1)
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("Watch after cancel: %v", err)
			}
		case <-time.After(waitLimit):
			t.Fatalf("Watch did not return within %s of its context ending", waitLimit)
		}
	})

	t.Run("stops with the error of fn", func(t *testing.T) {
		e := newEnv(t)
		s := e.sim(Options{})
		createN(t, s, 3)
		stop := errors.New("enough")
		calls := 0
		err := s.Watch(ctx, "0-0", func(region.Event) error {
			calls++
			if calls == 2 {
				return stop
			}
			return nil
		})
		if !errors.Is(err, stop) || calls != 2 {
			t.Errorf("Watch returned %v after %d calls, want %v after 2", err, calls, stop)
		}
	})
}

// TestOptions checks validation and defaults.
func TestOptions(t *testing.T) {
	cat := region.Demo()
	cases := []struct {
		name string
		opts Options
		ok   bool
	}{
		{"defaults", Options{Catalog: cat}, true},
		{"everything set", Options{Catalog: cat, BuildDelay: time.Second, DeleteDelay: time.Second, Tick: time.Millisecond,
			Faults: Faults{ErrorRate: 1, SlowCalls: time.Millisecond, FailBuildPrefix: "x", DuplicateCreates: true}}, true},
		{"no catalogue", Options{}, false},
		{"negative BuildDelay", Options{Catalog: cat, BuildDelay: -time.Millisecond}, false},
		{"negative DeleteDelay", Options{Catalog: cat, DeleteDelay: -time.Millisecond}, false},
		{"negative Tick", Options{Catalog: cat, Tick: -time.Millisecond}, false},
		{"negative ErrorRate", Options{Catalog: cat, Faults: Faults{ErrorRate: -0.01}}, false},
		{"ErrorRate above 1", Options{Catalog: cat, Faults: Faults{ErrorRate: 1.01}}, false},
		{"negative SlowCalls", Options{Catalog: cat, Faults: Faults{SlowCalls: -time.Millisecond}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(nil, tc.opts)
			if tc.ok != (err == nil) {
				t.Fatalf("New: %v, want ok=%v", err, tc.ok)
			}
			if !tc.ok {
				if s != nil {
					t.Errorf("New returned a simulator along with %v", err)
				}
				return
			}
			if tc.opts.Tick == 0 && s.opts.Tick != 10*time.Millisecond {
				t.Errorf("default Tick %s, want 10ms", s.opts.Tick)
			}
			if s.opts.Now == nil {
				t.Errorf("Now not defaulted")
			}
		})
	}
}
