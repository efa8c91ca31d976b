package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
)

// The operational verbs end to end: GraphQL in, the region and the workers
// behind, and a WebSocket subscriber watching what happens to the instance.

// verbLimit bounds every wait for the workers and the region; in practice they take
// milliseconds.
const verbLimit = 10 * time.Second

// pausableClock is the simulated region's clock as its ticker sees it: real time, or a time
// frozen in the past, so that what the region is doing (a reboot, a snapshot) stays in
// progress until the test has looked at it.
type pausableClock struct {
	mu     sync.Mutex
	frozen time.Time
	// stopWorkers stops the worker and the ticker behind the API, for a test that must set
	// the region up without a worker reacting.
	stopWorkers func()
}

func (c *pausableClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.frozen.IsZero() {
		return c.frozen
	}
	return time.Now()
}

// freeze stops the clock. It returns once real time has moved past the frozen millisecond, so
// that anything the API asks of the region from then on is due after every time a tick
// already under way may be using.
func (c *pausableClock) freeze() {
	c.mu.Lock()
	c.frozen = time.Now()
	at := c.frozen.UnixMilli()
	c.mu.Unlock()
	for time.Now().UnixMilli() <= at {
		// At most a millisecond: the region's due times have millisecond resolution.
	}
}

func (c *pausableClock) thaw() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = time.Time{}
}

// realise runs a worker and the region's clock behind the API, with the clock pausable: the
// same region state in Redis, seen by a simulator whose ticker reads the pausable clock.
func (a *api) realise(tb testing.TB) *pausableClock {
	tb.Helper()
	clock := &pausableClock{}
	clocked, err := sim.New(a.rdb, sim.Options{Catalog: region.Demo(), Tick: 5 * time.Millisecond, Now: clock.now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	clock.stopWorkers = (&api{rdb: a.rdb, region: clocked}).runWorkers(tb)
	return clock
}

// verbSubQuery is the organization's instanceEvents subscription with what the verbs record.
const verbSubQuery = `subscription { instanceEvents(organizationId: "acme") {
  kind changedFields message actor action outcome
  instance { id desiredPowerState status { provisioningStatus powerState } } } }`

// verbEvent is one event of verbSubQuery.
type verbEvent struct {
	Kind          string   `json:"kind"`
	ChangedFields []string `json:"changedFields"`
	Message       *string  `json:"message"`
	Actor         *string  `json:"actor"`
	Action        *string  `json:"action"`
	Outcome       *string  `json:"outcome"`
	Instance      struct {
		ID                string `json:"id"`
		DesiredPowerState string `json:"desiredPowerState"`
		Status            struct {
			ProvisioningStatus string `json:"provisioningStatus"`
			PowerState         string `json:"powerState"`
		} `json:"status"`
	} `json:"instance"`
}

func (ev verbEvent) String() string {
	s := func(p *string) string {
		if p == nil {
			return "null"
		}
		return *p
	}
	return fmt.Sprintf("%s %v action=%s actor=%s outcome=%s desired=%s %s/%s", ev.Kind, ev.ChangedFields, s(ev.Action), s(ev.Actor),
		s(ev.Outcome), ev.Instance.DesiredPowerState, ev.Instance.Status.ProvisioningStatus, ev.Instance.Status.PowerState)
}

// wanted is an event a test waits for.
type wanted struct {
	what  string
	match func(verbEvent) bool
}

// action matches the ACTION event of a verb on the instance.
func action(id, verb string) wanted {
	return wanted{"ACTION " + verb, func(ev verbEvent) bool {
		return ev.Kind == "ACTION" && ev.Instance.ID == id && ev.Action != nil && *ev.Action == verb
	}}
}

// power matches a status change of the instance to the power state, with the desired power.
func power(id, state, desired string) wanted {
	return wanted{"STATUS_CHANGED to " + state + " wanting " + desired, func(ev verbEvent) bool {
		return ev.Kind == "STATUS_CHANGED" && ev.Instance.ID == id && ev.Instance.Status.PowerState == state &&
			ev.Instance.Status.ProvisioningStatus == "PROVISIONED" && ev.Instance.DesiredPowerState == desired
	}}
}

// await reads the subscription until each wanted event arrived, in any order, and returns
// them in the order wanted; it fails the test after verbLimit.
func (c *wsClient) await(want ...wanted) []verbEvent {
	c.tb.Helper()
	got := make([]verbEvent, len(want))
	found := make([]bool, len(want))
	var seen []string
	deadline := time.Now().Add(verbLimit)
	for left := len(want); left > 0; {
		if time.Now().After(deadline) {
			c.tb.Fatalf("not within %s: %v; seen %v", verbLimit, want, seen)
		}
		ev := nextEvent[verbEvent](c)
		seen = append(seen, ev.String())
		for i, w := range want {
			if !found[i] && w.match(ev) {
				found[i], got[i] = true, ev
				left--
				break
			}
		}
	}
	return got
}

func (w wanted) String() string { return w.what }

// wantAction checks an ACTION event: the verb's caller, and a null outcome for success.
func wantAction(tb testing.TB, ev verbEvent, actor string, outcome string) {
	tb.Helper()
	if ev.Actor == nil || *ev.Actor != actor {
		tb.Errorf("%s: actor, want %s", ev, actor)
	}
	switch {
	case outcome == "" && ev.Outcome != nil:
		tb.Errorf("%s: outcome %s, want null", ev, *ev.Outcome)
	case outcome != "" && (ev.Outcome == nil || *ev.Outcome != outcome):
		tb.Errorf("%s: outcome, want %s", ev, outcome)
	}
	if ev.Message == nil || *ev.Message == "" {
		tb.Errorf("%s: no message", ev)
	}
}

const (
	startDoc    = `mutation($id: ID!) { startInstance(input: {id: $id}) { instance { id generation desiredPowerState } userErrors { field code message } } }`
	stopDoc     = `mutation($id: ID!) { stopInstance(input: {id: $id}) { instance { id generation desiredPowerState } userErrors { field code message } } }`
	rebootDoc   = `mutation($id: ID!, $hard: Boolean) { rebootInstance(input: {id: $id, hard: $hard}) { instance { id generation desiredPowerState } userErrors { field code message } } }`
	consoleDoc  = `mutation($id: ID!) { createConsoleSession(input: {id: $id}) { consoleSession { url expiresAt } userErrors { field code message } } }`
	snapshotDoc = `mutation($id: ID!, $name: String!, $tags: [TagInput!]) { snapshotInstance(input: {id: $id, name: $name, tags: $tags}) {
  image { id name state tags { name value } organizationId projectId } userErrors { field code message } } }`
	sshKeyDoc = `query($id: ID!) { instanceSSHKey(id: $id) { privateKey } }`
	imagesDoc = `query { images { id name state tags { name value } organizationId projectId } }`
)

// powerPayload is an InstancePowerPayload as the docs above select it.
type powerPayload struct {
	Instance *struct {
		ID                string `json:"id"`
		Generation        int    `json:"generation"`
		DesiredPowerState string `json:"desiredPowerState"`
	} `json:"instance"`
	UserErrors []userError `json:"userErrors"`
}

type gqlImage struct {
	ID             string   `json:"id"`
	Name           string   `json:"name"`
	State          string   `json:"state"`
	Tags           []gqlTag `json:"tags"`
	OrganizationID *string  `json:"organizationId"`
	ProjectID      *string  `json:"projectId"`
}

// powerVerb sends startInstance, stopInstance or rebootInstance and decodes the payload.
func (a *api) powerVerb(tb testing.TB, token, doc, field string, vars map[string]any) (*gqlResponse, powerPayload) {
	tb.Helper()
	res := a.post(tb, token, doc, vars)
	var p powerPayload
	if res.Data != nil && res.Data[field] != nil {
		decode(tb, res.Data[field], &p)
	}
	return res, p
}

// mustPower sends a power verb that must succeed and returns the instance's desired power.
func (a *api) mustPower(tb testing.TB, token, doc, field string, vars map[string]any) string {
	tb.Helper()
	res, p := a.powerVerb(tb, token, doc, field, vars)
	if res.Status != http.StatusOK || len(res.Errors) > 0 || len(p.UserErrors) > 0 || p.Instance == nil {
		tb.Fatalf("%s refused: %s", field, res.Raw)
	}
	return p.Instance.DesiredPowerState
}

// images returns the images the token's principal sees.
func (a *api) images(tb testing.TB, token string) []gqlImage {
	tb.Helper()
	var imgs []gqlImage
	decode(tb, a.mustPost(tb, token, imagesDoc, nil).Data["images"], &imgs)
	return imgs
}

func findImage(imgs []gqlImage, id string) *gqlImage {
	for i := range imgs {
		if imgs[i].ID == id {
			return &imgs[i]
		}
	}
	return nil
}

// operator returns a token with the operator role in acme/web, for subject olga.
func (a *api) operator(tb testing.TB) string {
	return a.token(tb, "olga", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleOperator})
}

// TestVerbsReachTheSubscriber: an operator's verbs on a running instance each succeed, are
// recorded as ACTION events with the operator as actor and no outcome, and their effect
// reaches a WebSocket subscriber as the workers see it: stopped (and wanted stopped), started,
// hard-rebooted and back, a console URL, the project key, and a snapshot image that drops the
// caller's reserved tags, names its source and turns READY.
func TestVerbsReachTheSubscriber(t *testing.T) {
	a, s := wsServer(t)
	clock := a.realise(t)
	op := a.operator(t)
	c := subscribeWS(t, s, protoTransportWS, op, verbSubQuery)
	id := a.mustCreate(t, a.admin(t), createInput("verbs")).ID
	vars := map[string]any{"id": id}
	c.await(power(id, "RUNNING", "RUNNING"))

	t.Run("stop", func(t *testing.T) {
		if got := a.mustPower(t, op, stopDoc, "stopInstance", vars); got != "STOPPED" {
			t.Errorf("desiredPowerState %s after stopInstance, want STOPPED", got)
		}
		evs := c.await(action(id, "STOP"), power(id, "STOPPED", "STOPPED"))
		wantAction(t, evs[0], "olga", "")
		if evs[0].Instance.DesiredPowerState != "STOPPED" || !reflect.DeepEqual(evs[0].ChangedFields, []string{"desiredPowerState"}) {
			t.Errorf("stop event %s, want it to name desiredPowerState, now STOPPED", evs[0])
		}
	})
	t.Run("start", func(t *testing.T) {
		if got := a.mustPower(t, op, startDoc, "startInstance", vars); got != "RUNNING" {
			t.Errorf("desiredPowerState %s after startInstance, want RUNNING", got)
		}
		evs := c.await(action(id, "START"), power(id, "RUNNING", "RUNNING"))
		wantAction(t, evs[0], "olga", "")
	})
	t.Run("hard reboot", func(t *testing.T) {
		// The clock stands still until the workers have shown the reboot under way.
		clock.freeze()
		a.mustPower(t, op, rebootDoc, "rebootInstance", map[string]any{"id": id, "hard": true})
		evs := c.await(action(id, "HARD_REBOOT"), wanted{"STATUS_CHANGED to PENDING", func(ev verbEvent) bool {
			return ev.Kind == "STATUS_CHANGED" && ev.Instance.ID == id && ev.Instance.Status.PowerState == "PENDING"
		}})
		wantAction(t, evs[0], "olga", "")
		if len(evs[0].ChangedFields) != 0 {
			t.Errorf("reboot event %s changed fields, want none", evs[0])
		}
		clock.thaw()
		c.await(power(id, "RUNNING", "RUNNING"))
	})
	t.Run("console", func(t *testing.T) {
		res := a.mustPost(t, op, consoleDoc, vars)
		var p struct {
			ConsoleSession *struct {
				URL       string    `json:"url"`
				ExpiresAt time.Time `json:"expiresAt"`
			} `json:"consoleSession"`
			UserErrors []userError `json:"userErrors"`
		}
		decode(t, res.Data["createConsoleSession"], &p)
		if p.ConsoleSession == nil || len(p.UserErrors) != 0 {
			t.Fatalf("createConsoleSession: %s", res.Raw)
		}
		if !strings.HasPrefix(p.ConsoleSession.URL, "ws://") {
			t.Errorf("console URL %q", p.ConsoleSession.URL)
		}
		if !p.ConsoleSession.ExpiresAt.After(time.Now()) {
			t.Errorf("console session expires at %s, in the past", p.ConsoleSession.ExpiresAt)
		}
		wantAction(t, c.await(action(id, "CONSOLE"))[0], "olga", "")
	})
	t.Run("ssh key", func(t *testing.T) {
		res := a.mustPost(t, op, sshKeyDoc, vars)
		var key struct {
			PrivateKey string `json:"privateKey"`
		}
		decode(t, res.Data["instanceSSHKey"], &key)
		if !strings.HasPrefix(key.PrivateKey, "-----BEGIN PRIVATE KEY-----") {
			t.Errorf("private key %q, want PEM", key.PrivateKey)
		}
		wantAction(t, c.await(action(id, "SSH_KEY"))[0], "olga", "")
	})
	t.Run("snapshot", func(t *testing.T) {
		// The image stays CREATING while the clock stands still.
		clock.freeze()
		res := a.mustPost(t, op, snapshotDoc, map[string]any{"id": id, "name": "verbs-snap", "tags": []map[string]string{
			{"name": "team", "value": "web"},
			{"name": "compute/evil", "value": "x"},
			{"name": "compute/source-instance-id", "value": "00000000-0000-0000-0000-000000000000"},
		}})
		var p struct {
			Image      *gqlImage   `json:"image"`
			UserErrors []userError `json:"userErrors"`
		}
		decode(t, res.Data["snapshotInstance"], &p)
		if p.Image == nil || len(p.UserErrors) != 0 {
			t.Fatalf("snapshotInstance: %s", res.Raw)
		}
		wantTags := []gqlTag{{"compute/source-instance-id", id}, {"team", "web"}}
		img := *p.Image
		if !reflect.DeepEqual(img.Tags, wantTags) || img.Name != "verbs-snap" || img.State != "CREATING" ||
			deref(img.OrganizationID) != "acme" || deref(img.ProjectID) != "web" {
			t.Errorf("image %+v, want verbs-snap of acme/web, CREATING, with tags %v", img, wantTags)
		}
		wantAction(t, c.await(action(id, "SNAPSHOT"))[0], "olga", "")

		listed := findImage(a.images(t, op), img.ID)
		if listed == nil || listed.State != "CREATING" || !reflect.DeepEqual(listed.Tags, wantTags) {
			t.Errorf("images lists %+v, want the image CREATING with tags %v", listed, wantTags)
		}
		// A project the image does not belong to does not see it.
		other := a.token(t, "gus", auth.Grant{OrganizationID: "globex", Role: auth.RoleAdmin})
		if found := findImage(a.images(t, other), img.ID); found != nil {
			t.Errorf("globex sees acme's snapshot %+v", found)
		}
		clock.thaw()
		eventually.Holds(t, verbLimit, func() bool {
			listed = findImage(a.images(t, op), img.ID)
			return listed != nil && listed.State == "READY"
		}, "the image READY, last %+v", listed)
	})

	// The history has every verb, in order, by the operator, each a success.
	var history struct {
		Edges []struct {
			Node struct {
				Kind    string  `json:"kind"`
				Actor   *string `json:"actor"`
				Action  *string `json:"action"`
				Outcome *string `json:"outcome"`
			} `json:"node"`
		} `json:"edges"`
	}
	decode(t, a.mustPost(t, op, `query($id: ID!) { instanceEvents(id: $id, first: 100) { edges { node { kind actor action outcome } } } }`, vars).Data["instanceEvents"], &history)
	var verbs []string
	for _, e := range history.Edges {
		if n := e.Node; n.Kind == "ACTION" {
			verbs = append(verbs, deref(n.Action))
			if deref(n.Actor) != "olga" || n.Outcome != nil {
				t.Errorf("history: %s by %s with outcome %s, want by olga with none", deref(n.Action), deref(n.Actor), deref(n.Outcome))
			}
		}
	}
	if want := []string{"STOP", "START", "HARD_REBOOT", "CONSOLE", "SSH_KEY", "SNAPSHOT"}; !reflect.DeepEqual(verbs, want) {
		t.Errorf("history actions %v, want %v", verbs, want)
	}
}

// TestVerbRefusalsAreUserErrors: what the instance's state refuses is a userError on
// input.id with the code and the region's reason (UNPROCESSABLE), as is a server count other
// than one (CONSISTENCY); the SSH key query, which has no payload, returns them as top-level
// errors. Each refusal is recorded with its outcome.
func TestVerbRefusalsAreUserErrors(t *testing.T) {
	a, s := wsServer(t)
	workers := a.realise(t)
	op := a.operator(t)
	admin := a.admin(t)
	c := subscribeWS(t, s, protoTransportWS, op, verbSubQuery)
	id := a.mustCreate(t, admin, createInput("refused")).ID
	vars := map[string]any{"id": id}
	c.await(power(id, "RUNNING", "RUNNING"))

	refusal := func(t *testing.T, doc, field string, vars map[string]any, code, reason string) {
		t.Helper()
		res := a.post(t, op, doc, vars)
		if res.Status != http.StatusOK || len(res.Errors) > 0 || res.Data[field] == nil {
			t.Fatalf("%s: %s", field, res.Raw)
		}
		var p struct {
			Instance       any         `json:"instance"`
			ConsoleSession any         `json:"consoleSession"`
			UserErrors     []userError `json:"userErrors"`
		}
		decode(t, res.Data[field], &p)
		if got := fieldCodes(p.UserErrors); !reflect.DeepEqual(got, []fieldCode{fc(code, "input", "id")}) {
			t.Errorf("%s: userErrors %+v, want %s on input.id; body %s", field, got, code, res.Raw)
		}
		if len(p.UserErrors) == 1 && !strings.Contains(p.UserErrors[0].Message, reason) {
			t.Errorf("%s: message %q does not give the reason %q", field, p.UserErrors[0].Message, reason)
		}
		if p.Instance != nil || p.ConsoleSession != nil {
			t.Errorf("%s: a refused verb returned a result: %s", field, res.Raw)
		}
	}

	// Asking for the power the instance has is no refusal: it answers the instance and leaves
	// no history, so the next ACTION the subscriber sees is the stop.
	if got := a.mustPower(t, op, startDoc, "startInstance", vars); got != "RUNNING" {
		t.Errorf("start of a running instance: desired %s, want RUNNING", got)
	}
	a.mustPower(t, op, stopDoc, "stopInstance", vars)
	if ev := c.await(wanted{"the next ACTION", func(ev verbEvent) bool { return ev.Kind == "ACTION" && ev.Instance.ID == id }})[0]; deref(ev.Action) != "STOP" {
		t.Errorf("next action %s, want STOP: the start of a running instance was recorded", deref(ev.Action))
	}
	c.await(power(id, "STOPPED", "STOPPED"))
	if got := a.mustPower(t, op, stopDoc, "stopInstance", vars); got != "STOPPED" {
		t.Errorf("stop of a stopped instance: desired %s, want STOPPED", got)
	}
	refusal(t, rebootDoc, "rebootInstance", vars, "UNPROCESSABLE", "cannot reboot instance "+strconv.Quote(id)+" while its server is STOPPED")
	wantAction(t, c.await(action(id, "REBOOT"))[0], "olga", "UNPROCESSABLE")
	refusal(t, rebootDoc, "rebootInstance", map[string]any{"id": id, "hard": true}, "UNPROCESSABLE", "cannot hard-reboot instance "+strconv.Quote(id)+" while its server is STOPPED")
	wantAction(t, c.await(action(id, "HARD_REBOOT"))[0], "olga", "UNPROCESSABLE")
	refusal(t, consoleDoc, "createConsoleSession", vars, "UNPROCESSABLE", "STOPPED")
	wantAction(t, c.await(action(id, "CONSOLE"))[0], "olga", "UNPROCESSABLE")

	// An instance whose users log in with certificates of the project's SSH CA has no key to give.
	caID := a.mustCreate(t, admin, with("with-ca", map[string]any{"sshCertificateAuthorityId": "ca-acme-web"})).ID
	c.await(power(caID, "RUNNING", "RUNNING"))
	res := a.post(t, op, sshKeyDoc, map[string]any{"id": caID})
	wantError(t, res, http.StatusOK, "UNPROCESSABLE")
	if len(res.Errors) == 1 && !strings.Contains(res.Errors[0].Message, "ca-acme-web") {
		t.Errorf("message %q does not name the certificate authority", res.Errors[0].Message)
	}
	wantAction(t, c.await(action(caID, "SSH_KEY"))[0], "olga", "UNPROCESSABLE")

	// Two servers behind one instance: the verbs refuse to pick one. The workers are stopped
	// first: one would find the duplicate and delete it before the verb is called.
	workers.stopWorkers()
	inst := a.instanceScope(t, id)
	extra, err := a.region.CreateServer(context.Background(), region.ServerSpec{Scope: inst, Name: "refused", FlavorID: "g1.small",
		ImageID: "ubuntu-24.04", Tags: map[string]string{region.InstanceTag: id}})
	if err != nil {
		t.Fatal(err)
	}
	res = a.post(t, op, stopDoc, vars)
	var p powerPayload
	decode(t, res.Data["stopInstance"], &p)
	if got := fieldCodes(p.UserErrors); !reflect.DeepEqual(got, []fieldCode{fc("CONSISTENCY", "input", "id")}) ||
		!strings.Contains(p.UserErrors[0].Message, extra.ID) {
		t.Errorf("stop with two servers: %s, want CONSISTENCY on input.id naming %s", res.Raw, extra.ID)
	}
}

// instanceScope is where the instance's servers are: its organization, project, region and
// network, read through the API.
func (a *api) instanceScope(tb testing.TB, id string) region.Scope {
	tb.Helper()
	var inst struct {
		OrganizationID string `json:"organizationId"`
		ProjectID      string `json:"projectId"`
		NetworkID      string `json:"networkId"`
		Region         struct {
			ID string `json:"id"`
		} `json:"region"`
	}
	decode(tb, a.mustPost(tb, a.admin(tb), `query($id: ID!) { instance(id: $id) { organizationId projectId networkId region { id } } }`,
		map[string]any{"id": id}).Data["instance"], &inst)
	return region.Scope{OrganizationID: inst.OrganizationID, ProjectID: inst.ProjectID, RegionID: inst.Region.ID, NetworkID: inst.NetworkID}
}

// verbDocs are the verbs as one caller sends them, with the field each answers in.
var verbDocs = []struct {
	field string
	doc   string
	hard  bool
}{
	{"startInstance", startDoc, false},
	{"stopInstance", stopDoc, false},
	{"rebootInstance", rebootDoc, false},
	{"rebootInstance", rebootDoc, true},
	{"createConsoleSession", consoleDoc, false},
	{"snapshotInstance", snapshotDoc, false},
	{"instanceSSHKey", sshKeyDoc, false},
}

func verbVars(id string, hard bool) map[string]any {
	return map[string]any{"id": id, "hard": hard, "name": "snap"}
}

// TestVerbAuthorization: a viewer is FORBIDDEN every verb and the SSH key,
// another organization's principal is told the instance is NOT_FOUND, both as top-level
// errors that change nothing; an operator gets past authorisation on every verb but may not
// create or delete instances.
func TestVerbAuthorization(t *testing.T) {
	a := newAPI(t)
	id := a.mustCreate(t, a.admin(t), createInput("guarded")).ID
	callers := []struct {
		name  string
		token string
		code  string
	}{
		{"project viewer", a.token(t, "vera", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleViewer}), "FORBIDDEN"},
		{"organization viewer", a.token(t, "vic", auth.Grant{OrganizationID: "acme", Role: auth.RoleViewer}), "FORBIDDEN"},
		{"another organization's admin", a.token(t, "gus", auth.Grant{OrganizationID: "globex", Role: auth.RoleAdmin}), "NOT_FOUND"},
		{"another project's operator", a.token(t, "dan", auth.Grant{OrganizationID: "acme", ProjectID: "data", Role: auth.RoleOperator}), "NOT_FOUND"},
	}
	for _, c := range callers {
		for _, v := range verbDocs {
			t.Run(c.name+"/"+v.field+fmt.Sprintf("/hard=%v", v.hard), func(t *testing.T) {
				before := a.storeState(t)
				res := a.post(t, c.token, v.doc, verbVars(id, v.hard))
				wantError(t, res, http.StatusOK, c.code)
				if len(res.Errors) == 1 && !reflect.DeepEqual(res.Errors[0].Path, []any{v.field}) {
					t.Errorf("error path %v, want [%s]", res.Errors[0].Path, v.field)
				}
				if res.Data != nil {
					t.Errorf("data = %v, want null", res.Data)
				}
				if !reflect.DeepEqual(before, a.storeState(t)) {
					t.Error("a refused verb changed Redis")
				}
			})
		}
	}

	// The operator gets past authorisation: the server is not built yet (no workers run here),
	// so the stop is recorded as intent and the others are refused for the instance's state.
	op := a.operator(t)
	for _, v := range verbDocs {
		res := a.post(t, op, v.doc, verbVars(id, v.hard))
		for _, code := range res.codes() {
			if code == "FORBIDDEN" || code == "NOT_FOUND" {
				t.Errorf("operator %s: %s", v.field, res.Raw)
			}
		}
	}
	if got := a.mustPower(t, op, startDoc, "startInstance", map[string]any{"id": id}); got != "RUNNING" {
		t.Errorf("operator start after stop: desiredPowerState %s", got)
	}
	res, _ := a.create(t, op, createInput("by-operator"))
	wantError(t, res, http.StatusOK, "FORBIDDEN")
	res, _ = a.remove(t, op, id)
	wantError(t, res, http.StatusOK, "FORBIDDEN")
}

// TestVerbsOnADeletingInstance: an instance being deleted refuses every verb as
// UNPROCESSABLE, a userError of the mutations and the SSH key query's error.
func TestVerbsOnADeletingInstance(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	id := a.mustCreate(t, tok, createInput("doomed")).ID
	a.mustDelete(t, tok, id)
	for _, v := range verbDocs {
		t.Run(v.field+fmt.Sprintf("/hard=%v", v.hard), func(t *testing.T) {
			res := a.post(t, tok, v.doc, verbVars(id, v.hard))
			if v.field == "instanceSSHKey" {
				wantError(t, res, http.StatusOK, "UNPROCESSABLE")
				return
			}
			if res.Status != http.StatusOK || len(res.Errors) > 0 || res.Data[v.field] == nil {
				t.Fatalf("%s", res.Raw)
			}
			var p struct {
				UserErrors []userError `json:"userErrors"`
			}
			decode(t, res.Data[v.field], &p)
			if got := fieldCodes(p.UserErrors); !reflect.DeepEqual(got, []fieldCode{fc("UNPROCESSABLE", "input", "id")}) ||
				!strings.Contains(p.UserErrors[0].Message, "being deleted") {
				t.Errorf("userErrors %+v, want UNPROCESSABLE on input.id saying it is being deleted", p.UserErrors)
			}
		})
	}
}
