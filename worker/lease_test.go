package worker_test

import (
	"testing"
	"time"

	"github.com/computeql/computeql/instance"
)

// lease gives a create request a lease ending after d, with the action.
func lease(d time.Duration, action instance.ExpiryAction) func(*instance.CreateRequest) {
	return func(r *instance.CreateRequest) {
		at := time.Now().Add(d)
		r.ExpiresAt, r.ExpiryAction = &at, &action
	}
}

// TestLeasesEnd: at the end of its lease an instance is stopped (STOP) or deleted, its quota
// released (DELETE), each recorded as an ACTION EXPIRE by system before the change; an
// instance with deletion protection is stopped instead of deleted, and the ACTION says so.
func TestLeasesEnd(t *testing.T) {
	e := newEnv(t)
	const d = 1500 * time.Millisecond
	stopped := e.create(t, "lease-stop", lease(d, instance.ExpireStop))
	deleted := e.create(t, "lease-delete", lease(d, instance.ExpireDelete))
	kept := e.create(t, "lease-kept", lease(d, instance.ExpireDelete), func(r *instance.CreateRequest) { r.DeletionProtection = ptr(true) })
	for _, inst := range []*instance.Instance{stopped, deleted, kept} {
		e.waitRunning(t, inst.ID)
	}

	for _, inst := range []*instance.Instance{stopped, kept} {
		got := e.waitStopped(t, inst.ID)
		if got.DesiredPower() != instance.IntentStopped || got.ExpiresAt != nil {
			t.Errorf("%s after its lease: desired %s, lease %v; want STOPPED and no lease", got.Name, got.DesiredPower(), got.ExpiresAt)
		}
		if got.Spec.UpdatedAt.Before(*inst.ExpiresAt) {
			t.Errorf("%s was changed at %s, before its lease ended at %s", got.Name, got.Spec.UpdatedAt, inst.ExpiresAt)
		}
	}
	e.waitGone(t, deleted.ID)
	e.wantUsed(t, sum(stopped, kept))

	for _, tt := range []struct {
		inst    *instance.Instance
		outcome instance.Code
	}{
		{stopped, ""},
		{kept, instance.CodeUnprocessable},
	} {
		a := e.lastAction(t, tt.inst.ID)
		if a.Action != instance.ActionExpire || a.Actor != "system" || a.Outcome != tt.outcome || a.Message == "" {
			t.Errorf("%s: last action %s by %s outcome %q %q, want EXPIRE by system with outcome %q", tt.inst.Name, a.Action, a.Actor, a.Outcome, a.Message, tt.outcome)
		}
	}
	// The deleted one's history, which outlives it, has the EXPIRE before the deletion.
	hist, _, err := e.st.History(bg, "acme", deleted.ID, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	expired, marked := -1, -1
	for i, r := range hist {
		switch {
		case r.Kind == instance.EventAction && r.Action == instance.ActionExpire && r.Actor == "system":
			expired = i
		case r.Kind == instance.EventUpdated && r.Instance.DeletedAt != nil && marked < 0:
			marked = i
		}
	}
	if expired < 0 || marked < 0 || expired > marked {
		t.Errorf("history of the deleted instance: EXPIRE at %d, deletion at %d; want the EXPIRE first", expired, marked)
	}
}
