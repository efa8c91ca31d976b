package instance_test

import (
	"fmt"
	"testing"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/quota"
)

func TestConcurrentCreatesOfOneName(t *testing.T) {
	e := newEnv(t)
	const n = 50
	ids := make([]string, n)
	errs := run(n, func(i int) error {
		inst, err := e.svc.Create(acmeMember, validCreate())
		if err == nil {
			ids[i] = inst.ID
		}
		return err
	})
	won := 0
	for i, err := range errs {
		if err == nil {
			won++
			continue
		}
		wantProblems(t, err, p(Conflict, "name"))
		if ids[i] != "" {
			t.Errorf("loser %d got an instance", i)
		}
	}
	if won != 1 {
		t.Fatalf("%d creates won the name, want exactly 1", won)
	}
	if n := e.count(t, "acme"); n != 1 {
		t.Errorf("%d instances stored, want 1", n)
	}
	// Only the winner was charged.
	e.wantUsed(t, "acme", quota.Amounts{quota.Servers: 1, quota.CPUs: 2, quota.MemoryGiB: 4})
}

func TestConcurrentCreatesAgainstQuota(t *testing.T) {
	e := newEnv(t)
	const limit, n = 7, 40
	e.setLimits(t, "acme", map[quota.Kind]int64{quota.Servers: limit})
	errs := run(n, func(i int) error {
		r := validCreate()
		r.Name = fmt.Sprintf("web-%d", i)
		_, err := e.svc.Create(acmeMember, r)
		return err
	})
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
			continue
		}
		inv := wantProblems(t, err, p(QuotaExceeded, "flavorId"))
		if msg := inv.Problems[0].Message; msg != fmt.Sprintf("quota exceeded for servers: %d requested in total, limit %d", limit+1, limit) {
			t.Errorf("message %q", msg)
		}
	}
	if won != limit {
		t.Errorf("%d creates accepted, want %d", won, limit)
	}
	page, err := e.svc.List(acmeAdmin, instance.ListRequest{OrganizationID: "acme", First: ptr(100), WantTotal: true})
	if err != nil {
		t.Fatal(err)
	}
	if page.TotalCount != limit || len(page.Instances) != limit {
		t.Errorf("listing has %d instances (total %d), want %d", len(page.Instances), page.TotalCount, limit)
	}
	e.wantUsed(t, "acme", quota.Amounts{quota.Servers: limit, quota.CPUs: 2 * limit, quota.MemoryGiB: 4 * limit})
}

// TestConcurrentUpdatesCompareAndSet: many updates all based on generation 1; the store's
// compare-and-set lets exactly one through and the rest are CONFLICT, never INTERNAL.
func TestConcurrentUpdatesCompareAndSet(t *testing.T) {
	e := newEnv(t)
	inst := e.create(t, acmeMember, validCreate())
	const n = 40
	errs := run(n, func(i int) error {
		_, err := e.svc.Update(acmeMember, instance.UpdateRequest{
			ID: inst.ID, Description: ptr(fmt.Sprintf("writer %d", i)), ExpectedGeneration: ptr(int64(1)),
		})
		return err
	})
	won, lostWrite := -1, 0
	for i, err := range errs {
		if err == nil {
			if won >= 0 {
				t.Fatalf("updates %d and %d both succeeded", won, i)
			}
			won = i
			continue
		}
		// A writer that read generation 2 is refused on expectedGeneration; one that read 1
		// but lost the write is refused by the store's compare-and-set on the id.
		inv := wantInvalid(t, err)
		if len(inv.Problems) != 1 || inv.Problems[0].Code != Conflict ||
			(fmt.Sprint(inv.Problems[0].Field) != fmt.Sprint(in("expectedGeneration")) && fmt.Sprint(inv.Problems[0].Field) != fmt.Sprint(in("id"))) {
			t.Errorf("update %d: %v, want one CONFLICT", i, err)
		}
		if inv.Problems[0].Field[1] == "id" {
			lostWrite++
		}
	}
	if won < 0 {
		t.Fatal("no update succeeded")
	}
	t.Logf("%d writers lost at the store's compare-and-set", lostWrite)
	got := e.get(t, acmeMember, inst.ID)
	if got.Generation != 2 || got.Description != fmt.Sprintf("writer %d", won) {
		t.Errorf("generation %d description %q, want 2 and the winner's", got.Generation, got.Description)
	}
}

// TestConcurrentUpdatesWithoutExpectedGeneration: without a precondition, racing updates
// either apply or are refused as CONFLICT, and the generation counts the ones that applied.
func TestConcurrentUpdatesWithoutExpectedGeneration(t *testing.T) {
	e := newEnv(t)
	inst := e.create(t, acmeMember, validCreate())
	const n = 30
	errs := run(n, func(i int) error {
		_, err := e.svc.Update(acmeMember, instance.UpdateRequest{ID: inst.ID, Description: ptr(fmt.Sprintf("writer %d", i))})
		return err
	})
	applied := 0
	for _, err := range errs {
		if err == nil {
			applied++
			continue
		}
		wantProblems(t, err, p(Conflict, "id"))
	}
	if applied == 0 {
		t.Fatal("no update applied")
	}
	if got := e.get(t, acmeMember, inst.ID); got.Generation != int64(1+applied) {
		t.Errorf("generation %d after %d applied updates, want %d", got.Generation, applied, 1+applied)
	}
}
