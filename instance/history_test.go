package instance_test

import (
	"context"
	"strings"
	"testing"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/store"
)

// TestHistoryOutlivesTheInstance: once an instance is forgotten, those who could read it still
// read its history, DELETED last; anyone else is told it does not exist, word for word as for
// an id that never existed.
func TestHistoryOutlivesTheInstance(t *testing.T) {
	e := newEnv(t)
	inst := e.create(t, acmeMember, validCreate())
	stored, err := store.New(e.rdb).Get(context.Background(), []string{"acme"}, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := store.New(e.rdb).Forget(context.Background(), stored, e.now); err != nil || !ok {
		t.Fatal(err, ok)
	}
	if _, err := e.svc.Get(acmeViewer, inst.ID); err == nil {
		t.Fatal("the forgotten instance is still found")
	}
	page, err := e.svc.History(acmeViewer, inst.ID, nil, nil)
	if err != nil {
		t.Fatalf("history of a deleted instance: %v", err)
	}
	if n := len(page.Events); n < 2 || page.Events[0].Kind != instance.EventCreated || page.Events[n-1].Kind != instance.EventDeleted {
		t.Errorf("history of a deleted instance: %+v, want CREATED first and DELETED last", page.Events)
	}

	const unknown = "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f"
	for name, ctx := range map[string]context.Context{
		"another project's viewer":     as("dora", "acme", "data", auth.RoleViewer),
		"another organization's admin": as("gus", "globex", "", auth.RoleAdmin),
	} {
		_, err := e.svc.History(ctx, inst.ID, nil, nil)
		_, never := e.svc.History(ctx, unknown, nil, nil)
		wantCode(t, err, instance.CodeNotFound)
		if err == nil || never == nil || err.Error() != replaceID(never.Error(), unknown, inst.ID) {
			t.Errorf("%s: %v; an id that never existed: %v; want the same answer", name, err, never)
		}
	}
}

// replaceID returns the message with one id in place of another.
func replaceID(msg, from, to string) string { return strings.ReplaceAll(msg, from, to) }
