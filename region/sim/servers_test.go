package sim

import (
	"context"
	"maps"
	"slices"
	"testing"

	"github.com/computeql/computeql/region"
)

// TestServers lists every server and nothing else: more of them than one round trip reads,
// none of the region's other keys (tag indexes, address counters, events), a deleting server
// until the clock removes it.
func TestServers(t *testing.T) {
	e := newEnv(t)
	s := e.sim(Options{})
	ctx := context.Background()
	networks := []string{"net-acme-web-eu", "net-acme-web-us", "net-acme-data-eu", "net-globex-prod-eu"}
	want := map[string]region.ServerState{}
	for i := range serversBatch + 100 {
		srv, err := s.CreateServer(ctx, spec(t, networks[i%len(networks)], "srv", "i-"+string(rune('a'+i%26))))
		if err != nil {
			t.Fatalf("CreateServer: %v", err)
		}
		want[srv.ID] = srv.State
	}
	gone := slices.Sorted(maps.Keys(want))[0]
	if err := s.DeleteServer(ctx, gone); err != nil {
		t.Fatalf("DeleteServer: %v", err)
	}
	want[gone] = region.ServerDeleting

	list := func() map[string]region.ServerState {
		t.Helper()
		all, err := s.Servers(ctx)
		if err != nil {
			t.Fatalf("Servers: %v", err)
		}
		got := map[string]region.ServerState{}
		for _, srv := range all {
			if _, dup := got[srv.ID]; dup {
				t.Errorf("server %s listed twice", srv.ID)
			}
			got[srv.ID] = srv.State
		}
		return got
	}
	if got := list(); !maps.Equal(got, want) {
		t.Errorf("listed %d servers, want %d (with %s DELETING)", len(got), len(want), gone)
	}

	e.run(s)
	e.waitGone(t, s, gone)
	got := list()
	if _, ok := got[gone]; ok || len(got) != len(want)-1 {
		t.Errorf("after the deletion: %d servers listed (deleted one included: %v), want %d", len(got), ok, len(want)-1)
	}
}
