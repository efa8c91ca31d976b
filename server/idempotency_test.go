package server

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/store"
)

// historyLen is how many events the instance's history holds.
func (a *api) historyLen(t *testing.T, token, id string) int {
	t.Helper()
	res := a.mustPost(t, token, `query($id: ID!) { instanceEvents(id: $id, first: 100) { edges { cursor } } }`, map[string]any{"id": id})
	return len(res.Data["instanceEvents"].(map[string]any)["edges"].([]any))
}

// TestIdempotencyKeys: a create, an update or a delete sent again with its idempotency key is
// answered as the first was, with no second effect (no second instance, event or charge); the
// same key with another request is CONFLICT on input.idempotencyKey and writes nothing; keys
// are the caller's own; a malformed key is BAD_USER_INPUT.
func TestIdempotencyKeys(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)

	in := with("web-1", map[string]any{"idempotencyKey": "create-web-1"})
	first := a.mustCreate(t, tok, in)
	quotaAfterFirst := a.mustPost(t, tok, `{ quota(organizationId: "acme") { limits { kind used } } }`, nil).Data
	again := a.mustCreate(t, tok, in)
	if again.ID != first.ID {
		t.Fatalf("a retried create made %s, the first %s", again.ID, first.ID)
	}
	if got := a.mustPost(t, tok, `{ quota(organizationId: "acme") { limits { kind used } } }`, nil).Data; !reflect.DeepEqual(got, quotaAfterFirst) {
		t.Errorf("a retried create charged quota again: %s, was %s", got, quotaAfterFirst)
	}
	if n := a.historyLen(t, tok, first.ID); n != 1 {
		t.Errorf("%d events after a create and its retry, want 1 (CREATED)", n)
	}

	// The same key for another request: CONFLICT, nothing written.
	before := redistest.State(t, a.rdb)
	res, p := a.create(t, tok, with("web-2", map[string]any{"idempotencyKey": "create-web-1"}))
	wantUserErrors(t, res, p, fc("CONFLICT", "input", "idempotencyKey"))
	if !maps.Equal(before, redistest.State(t, a.rdb)) {
		t.Error("a key reused for another request changed Redis")
	}

	// Keys are the caller's: another principal's same key is a key of its own.
	other := a.token(t, "olga", auth.Grant{OrganizationID: "acme", Role: auth.RoleAdmin})
	if own := a.mustCreate(t, other, with("web-3", map[string]any{"idempotencyKey": "create-web-1"})); own.ID == first.ID {
		t.Error("another caller's key answered with the first caller's instance")
	}

	// Update: a retry after the first applied (its expectedGeneration is stale by then) is
	// answered with the instance, and records nothing more.
	upd := map[string]any{"id": first.ID, "description": "first", "expectedGeneration": 1, "idempotencyKey": "describe-1"}
	for range 2 {
		if res, p := a.update(t, tok, upd); len(p.UserErrors) > 0 || p.Instance == nil || p.Instance.Generation != 2 || p.Instance.Description != "first" {
			t.Fatalf("update or its retry: %s", res.Raw)
		}
	}
	if n := a.historyLen(t, tok, first.ID); n != 2 {
		t.Errorf("%d events after an update and its retry, want 2", n)
	}
	res, p = a.update(t, tok, map[string]any{"id": first.ID, "description": "second", "idempotencyKey": "describe-1"})
	wantUserErrors(t, res, p, fc("CONFLICT", "input", "idempotencyKey"))

	// Delete: retried while deleting, then once the instance is gone: no error either time.
	const del = `mutation($id: ID!, $key: String) { deleteInstance(input: {id: $id, idempotencyKey: $key}) {
	  instance { id status { provisioningStatus } } userErrors { field code message } } }`
	vars := map[string]any{"id": first.ID, "key": "delete-1"}
	for range 2 {
		res := a.mustPost(t, tok, del, vars)
		if got := fmt.Sprint(res.Data["deleteInstance"]); !strings.Contains(got, "DEPROVISIONING") || !strings.Contains(got, "userErrors:[]") {
			t.Fatalf("delete or its retry: %s", res.Raw)
		}
	}
	st := store.New(a.rdb)
	stored, err := st.Get(context.Background(), []string{"acme"}, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := st.Forget(context.Background(), stored, time.Now()); err != nil || !ok {
		t.Fatal(err, ok)
	}
	if res := a.mustPost(t, tok, del, vars); fmt.Sprint(res.Data["deleteInstance"]) != "map[instance:<nil> userErrors:[]]" {
		t.Errorf("a retried delete of an instance gone since: %s, want no instance and no error", res.Raw)
	}
	if res := a.post(t, tok, del, map[string]any{"id": first.ID}); !slices.Equal(res.codes(), []string{"NOT_FOUND"}) {
		t.Errorf("a delete of the gone instance without the key: %s, want NOT_FOUND", res.Raw)
	}

	for _, tt := range []struct {
		name, key, code string
	}{
		{"empty", "", "BAD_USER_INPUT"},
		{"65 characters", strings.Repeat("k", 65), "BAD_USER_INPUT"},
		{"a space", "two words", "BAD_USER_INPUT"},
		{"not ASCII", "clé", "BAD_USER_INPUT"},
		{"64 characters", strings.Repeat("k", 64), ""},
		{"punctuation", "a-b_c.d:e/f~1", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res, p := a.create(t, tok, with("k-"+strings.ReplaceAll(tt.name, " ", "-"), map[string]any{"idempotencyKey": tt.key}))
			if tt.code == "" {
				if len(p.UserErrors) > 0 || p.Instance == nil {
					t.Errorf("key %q refused: %s", tt.key, res.Raw)
				}
				return
			}
			wantUserErrors(t, res, p, fc(tt.code, "input", "idempotencyKey"))
		})
	}
}

// TestIdempotencyKeyRace: retries sent at once, while none has finished, make one instance:
// the script that makes it records the key, and the others are answered from it.
func TestIdempotencyKeyRace(t *testing.T) {
	a := newAPI(t, func(o *Options) { o.RateLimit = -1 })
	tok := a.admin(t)
	in := with("raced", map[string]any{"idempotencyKey": "race-1"})
	ids := make([]string, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			if _, p := a.create(t, tok, in); p.Instance != nil {
				ids[i] = p.Instance.ID
			}
		})
	}
	wg.Wait()
	for _, id := range ids[1:] {
		if id != ids[0] || id == "" {
			t.Fatalf("concurrent retries answered %v, want one instance", ids)
		}
	}
	res := a.mustPost(t, tok, `{ instances(organizationId: "acme") { totalCount } }`, nil)
	if got := res.Data["instances"]; !reflect.DeepEqual(got, map[string]any{"totalCount": float64(1)}) {
		t.Errorf("instances after concurrent retries: %v, want 1", got)
	}
}

// actionsOf counts the instance's ACTION events by verb.
func (a *api) actionsOf(t *testing.T, token, id string) map[string]int {
	t.Helper()
	res := a.mustPost(t, token, `query($id: ID!) { instanceEvents(id: $id, first: 100) { edges { node { kind action } } } }`, map[string]any{"id": id})
	out := map[string]int{}
	for _, e := range res.Data["instanceEvents"].(map[string]any)["edges"].([]any) {
		n := e.(map[string]any)["node"].(map[string]any)
		if n["kind"] == "ACTION" {
			out[n["action"].(string)]++
		}
	}
	return out
}

// TestIdempotentVerbs: a stop, a start and a reboot retried with their keys are answered with
// the instance and do nothing again (one ACTION each, the server rebooted once); the same key
// for another verb is CONFLICT.
func TestIdempotentVerbs(t *testing.T) {
	a, s := wsServer(t)
	a.realise(t)
	op := a.operator(t)
	admin := a.admin(t)
	c := subscribeWS(t, s, protoTransportWS, op, verbSubQuery)
	id := a.mustCreate(t, admin, createInput("retried")).ID
	c.await(power(id, "RUNNING", "RUNNING"))

	verb := func(t *testing.T, name, key string, extra string) *gqlResponse {
		t.Helper()
		doc := fmt.Sprintf(`mutation($id: ID!, $key: String) { r: %s(input: {id: $id, idempotencyKey: $key%s}) {
		  instance { id desiredPowerState } userErrors { field code message } } }`, name, extra)
		return a.post(t, op, doc, map[string]any{"id": id, "key": key})
	}
	twice := func(name, key, extra, want string) {
		t.Helper()
		for range 2 {
			if res := verb(t, name, key, extra); !strings.Contains(string(res.Raw), `"desiredPowerState":"`+want+`"},"userErrors":[]`) {
				t.Fatalf("%s or its retry: %s", name, res.Raw)
			}
		}
	}
	twice("stopInstance", "stop-1", "", "STOPPED")
	c.await(power(id, "STOPPED", "STOPPED"))
	twice("startInstance", "start-1", "", "RUNNING")
	c.await(power(id, "RUNNING", "RUNNING"))
	twice("rebootInstance", "reboot-1", ", hard: true", "RUNNING")
	if got := a.actionsOf(t, op, id); got["STOP"] != 1 || got["START"] != 1 || got["HARD_REBOOT"] != 1 {
		t.Errorf("actions after each verb was retried: %v, want one of each", got)
	}
	const stop = `mutation($id: ID!, $key: String) { stopInstance(input: {id: $id, idempotencyKey: $key}) {
	  instance { desiredPowerState } userErrors { field code message } } }`
	res := a.post(t, op, stop, map[string]any{"id": id, "key": "reboot-1"})
	if !strings.Contains(string(res.Raw), `"field":["input","idempotencyKey"],"code":"CONFLICT"`) {
		t.Errorf("a reboot's key sent with a stop: %s, want CONFLICT on input.idempotencyKey", res.Raw)
	}
}

// TestIdempotentSetQuota: setQuota retried with its key is answered with the quota as it is
// now, even after the limits changed meanwhile, without setting them again; the same key for
// other limits is CONFLICT and writes nothing.
func TestIdempotentSetQuota(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	const doc = `mutation($l: Int!, $key: String) { setQuota(input: {organizationId: "acme", limits: [{kind: "servers", limit: $l}], idempotencyKey: $key}) {
	  quota { limits { kind limit } } userErrors { field code message } } }`
	servers := func(res *gqlResponse) any {
		for _, l := range res.Data["setQuota"].(map[string]any)["quota"].(map[string]any)["limits"].([]any) {
			if m := l.(map[string]any); m["kind"] == "servers" {
				return m["limit"]
			}
		}
		return nil
	}
	if got := servers(a.mustPost(t, tok, doc, map[string]any{"l": 7, "key": "q-7"})); got != float64(7) {
		t.Fatalf("servers limit %v after setQuota, want 7", got)
	}
	// Changed since by a call without a key: the retry answers 9, as the quota is now.
	a.mustPost(t, tok, doc, map[string]any{"l": 9})
	if got := servers(a.mustPost(t, tok, doc, map[string]any{"l": 7, "key": "q-7"})); got != float64(9) {
		t.Errorf("servers limit %v after a retry, want 9: the retry must not set 7 again", got)
	}
	before := redistest.State(t, a.rdb)
	res := a.post(t, tok, doc, map[string]any{"l": 8, "key": "q-7"})
	if !strings.Contains(string(res.Raw), `"field":["input","idempotencyKey"],"code":"CONFLICT"`) {
		t.Errorf("the key with other limits: %s, want CONFLICT on input.idempotencyKey", res.Raw)
	}
	if !maps.Equal(before, redistest.State(t, a.rdb)) {
		t.Error("a key reused for other limits changed Redis")
	}
}

// TestIdempotentSnapshotAndConsole: a snapshot retried with its key is answered with the
// image the first call made, one image in all, even when the first call's record was lost
// (the image is found by its request tag); a console session retried with its key is the same
// session while it is valid.
func TestIdempotentSnapshotAndConsole(t *testing.T) {
	a, s := wsServer(t)
	a.realise(t)
	op := a.operator(t)
	c := subscribeWS(t, s, protoTransportWS, op, verbSubQuery)
	id := a.mustCreate(t, a.admin(t), createInput("imaged")).ID
	c.await(power(id, "RUNNING", "RUNNING"))

	const snap = `mutation($id: ID!, $name: String!, $key: String) { snapshotInstance(input: {id: $id, name: $name, idempotencyKey: $key}) {
	  image { id } userErrors { field code message } } }`
	imageID := func(res *gqlResponse) string {
		img, _ := res.Data["snapshotInstance"].(map[string]any)["image"].(map[string]any)
		id, _ := img["id"].(string)
		return id
	}
	first := imageID(a.mustPost(t, op, snap, map[string]any{"id": id, "name": "nightly", "key": "snap-1"}))
	if again := imageID(a.mustPost(t, op, snap, map[string]any{"id": id, "name": "nightly", "key": "snap-1"})); first == "" || again != first {
		t.Fatalf("snapshot %q, its retry %q: want the same image", first, again)
	}
	res := a.post(t, op, snap, map[string]any{"id": id, "name": "weekly", "key": "snap-1"})
	if !strings.Contains(string(res.Raw), `"field":["input","idempotencyKey"],"code":"CONFLICT"`) {
		t.Errorf("the key for another snapshot: %s, want CONFLICT on input.idempotencyKey", res.Raw)
	}
	// The first call's record lost (its key deleted, as a crash between the region's answer
	// and the record would leave it): the retry still finds the image by its tag.
	idemKeys := func() []string {
		keys, err := a.rdb.Keys(context.Background(), "*:idem:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	keys := idemKeys()
	if len(keys) != 1 {
		t.Fatalf("idempotency keys %v, want the snapshot's one", keys)
	}
	a.rdb.Del(context.Background(), keys[0])
	if again := imageID(a.mustPost(t, op, snap, map[string]any{"id": id, "name": "nightly", "key": "snap-1"})); again != first {
		t.Errorf("a retry whose record was lost answered image %q, want %q", again, first)
	}
	n := 0
	for _, img := range a.images(t, op) {
		if img.Name == "nightly" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d images named nightly, want 1", n)
	}

	const console = `mutation($id: ID!, $key: String) { createConsoleSession(input: {id: $id, idempotencyKey: $key}) {
	  consoleSession { url expiresAt } userErrors { field code message } } }`
	url := func(res *gqlResponse) string {
		cs, _ := res.Data["createConsoleSession"].(map[string]any)["consoleSession"].(map[string]any)
		u, _ := cs["url"].(string)
		return u
	}
	u1 := url(a.mustPost(t, op, console, map[string]any{"id": id, "key": "console-1"}))
	if u2 := url(a.mustPost(t, op, console, map[string]any{"id": id, "key": "console-1"})); u1 == "" || u2 != u1 {
		t.Errorf("console session %q, its retry %q: want the same", u1, u2)
	}
	if u3 := url(a.mustPost(t, op, console, map[string]any{"id": id})); u3 == u1 {
		t.Error("a console session without the key is the keyed one")
	}
	if got := a.actionsOf(t, op, id); got["SNAPSHOT"] != 1 || got["CONSOLE"] != 2 {
		t.Errorf("actions %v, want one SNAPSHOT and two CONSOLE (the keyed one and the other)", got)
	}
	// The session's key is kept only while the session is valid: its URL is a credential.
	for _, k := range idemKeys() {
		if ttl := a.rdb.TTL(context.Background(), k).Val(); ttl <= 0 || ttl > 10*time.Minute {
			t.Errorf("the console session's key %s is kept %s, want at most the session's 10 minutes", k, ttl)
		}
	}
}
