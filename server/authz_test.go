package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/graph"
	"github.com/computeql/computeql/logtest"
)

// The columns of the authorization matrix: who calls. The roles are grants in organization
// acme: viewer, operator and member on its project web, admin organization-wide (admin is
// organization-wide only). The first three never get past authentication; the wrong-key and
// expired tokens carry acme admin grants, so that only the token check can refuse them.
const (
	authzNone     = iota // no Authorization header (WebSocket: connection_init without a token)
	authzExpired         // signed with the API's secret, expired beyond the 30 s clock skew
	authzWrongKey        // HS256 with another 32-byte secret
	authzOtherOrg        // admin of globex only
	authzViewer
	authzOperator
	authzMember
	authzAdmin
	authzColumns
)

var authzColumnNames = [authzColumns]string{"none", "expired", "wrongKey", "otherOrg", "viewer", "operator", "member", "admin"}

// authzRow is one operation's expected outcome per column.
type authzRow [authzColumns]string

// The outcomes of a cell. A top-level error is its extensions.code (several joined by "+"); a
// refused mutation's userErrors are "userErrors[CODE]", to tell them apart.
const (
	authzOK    = "OK"
	authzEmpty = "EMPTY" // an empty list: the caller sees nothing of what was asked for
	authzNull  = "NULL"  // a null result without an error
	// authzUnauthenticated is HTTP 401 with the single error code UNAUTHENTICATED and no data.
	authzUnauthenticated = "UNAUTHENTICATED"
	authzClose4401       = "close 4401" // WebSocket closed: connection_init without a token
	authzClose4403       = "close 4403" // WebSocket closed: connection_init with a bad token
)

func authzUserErrors(code string) string { return "userErrors[" + code + "]" }

// authzFixture is what a cell's variables may refer to.
type authzFixture struct {
	shared string // an instance of acme/web made by the admin in setup, still pending
	own    string // for cases with own: an instance of acme/web made for this cell alone
	name   string // a name no other cell uses
}

// authzCase is one root field of the schema with the document that exercises it.
type authzCase struct {
	field string // "Query.me": the root type and the field
	doc   string // for subscriptions, the subscription's document, run over a WebSocket
	vars  func(f authzFixture) map[string]any
	// own: every cell acts on an instance of its own, which prepare (when set) readies as
	// the admin; for operations whose allowed calls change the instance.
	own     bool
	prepare func(tb testing.TB, a *api, admin, id string)
	want    authzRow
}

func authzID(f authzFixture) map[string]any    { return map[string]any{"id": f.shared} }
func authzOwnID(f authzFixture) map[string]any { return map[string]any{"id": f.own} }

// authzRootFields lists "Type.field" for every root field of the executable schema the server
// serves (server.New builds it with graph.NewSchema; the schema does not depend on the
// resolvers), without gqlgen's introspection fields.
func authzRootFields() []string {
	s := graph.NewSchema(nil, nil, 0).Schema()
	var out []string
	for _, def := range []*ast.Definition{s.Query, s.Mutation, s.Subscription} {
		if def == nil {
			continue
		}
		for _, f := range def.Fields {
			if !strings.HasPrefix(f.Name, "__") {
				out = append(out, def.Name+"."+f.Name)
			}
		}
	}
	return out
}

// authzOutcome reduces an HTTP response to a cell of the matrix.
func authzOutcome(res *gqlResponse, field string) string {
	_, name, _ := strings.Cut(field, ".")
	if res.Status != http.StatusOK {
		if res.Status == http.StatusUnauthorized && slices.Equal(res.codes(), []string{"UNAUTHENTICATED"}) && res.Data == nil {
			return authzUnauthenticated
		}
		return fmt.Sprintf("HTTP %d %v", res.Status, res.codes())
	}
	if len(res.Errors) > 0 {
		codes := strings.Join(res.codes(), "+")
		if res.Data != nil && res.Data[name] != nil {
			return "data and errors " + codes
		}
		return codes
	}
	switch v := res.Data[name].(type) {
	case nil:
		return authzNull
	case []any:
		if len(v) == 0 {
			return authzEmpty
		}
	case map[string]any:
		ues, isPayload := v["userErrors"].([]any)
		if !isPayload {
			break
		}
		if len(ues) > 0 {
			var codes []string
			for _, ue := range ues {
				c, _ := ue.(map[string]any)["code"].(string)
				codes = append(codes, c)
			}
			return authzUserErrors(strings.Join(codes, "+"))
		}
		for k, x := range v {
			if k != "userErrors" && x == nil {
				return "payload with " + k + " null and no userErrors"
			}
		}
	}
	return authzOK
}

// authzSubscriptionOutcome runs the subscription over graphql-transport-ws with the token (""
// sends connection_init without one) and reduces what comes first to a cell: the close code
// of a refused connection_init, the codes of an error, or OK for a first event SNAPSHOT.
func authzSubscriptionOutcome(tb testing.TB, s *httptest.Server, token, doc string) string {
	tb.Helper()
	c := mustDialWS(tb, wsURL(s), protoTransportWS, wsDial{})
	defer c.conn.Close()
	if token == "" {
		c.init(nil)
	} else {
		c.init(map[string]any{"Authorization": "Bearer " + token})
	}
	select {
	case m := <-c.msgs:
		if m.Type != "connection_ack" {
			return fmt.Sprintf("%s %s after connection_init", m.Type, m.Payload)
		}
	case <-c.done:
		var ce *websocket.CloseError
		if errors.As(c.err, &ce) {
			return fmt.Sprintf("close %d", ce.Code)
		}
		return fmt.Sprintf("socket ended: %v", c.err)
	case <-time.After(5 * time.Second):
		tb.Fatal("no answer to connection_init within 5s")
	}
	c.start("s", doc)
	codes, m := c.opErrorCodes()
	defer c.stop()
	if len(codes) > 0 {
		return strings.Join(codes, "+")
	}
	var res gqlResponse
	if err := json.Unmarshal(m.Payload, &res); err != nil {
		tb.Fatal(err)
	}
	var ev subEvent
	decode(tb, res.Data["instanceEvents"], &ev)
	if ev.Kind != "SNAPSHOT" {
		return "first event " + ev.Kind
	}
	return authzOK
}

// withoutRateLimit turns the per-principal rate limit off: the matrix sends far more than a
// burst from one subject.
func withoutRateLimit(o *Options) { o.RateLimit = -1 }

// authzRefusals are the outcomes that must leave the store exactly as it was.
var authzRefusals = []string{authzUnauthenticated, "NOT_FOUND", "FORBIDDEN"}

// TestAuthorizationMatrix runs every query, mutation and the subscription as every kind of
// caller and checks the exact outcome: no, expired or wrongly signed
// token → UNAUTHENTICATED (HTTP 401; WebSocket close 4401/4403); an organization the caller has
// no grant in → NOT_FOUND for what is addressed by id or organization, nothing for listings;
// reads need viewer, power actions, console, SSH key and snapshot operator, changes member,
// quota admin. The table must name exactly the schema's root fields. A refused call writes
// nothing. Every mutation that ran is audited once with its caller and outcome (checkAudit).
// Instances are pending (no workers run), so the verbs that need a built server
// answer the roles allowed to call them with UNPROCESSABLE.
func TestAuthorizationMatrix(t *testing.T) {
	const (
		ok        = authzOK
		empty     = authzEmpty
		unauth    = authzUnauthenticated
		nf        = "NOT_FOUND"
		forbidden = "FORBIDDEN"
		unproc    = "UNPROCESSABLE"
	)
	ueUnproc := authzUserErrors("UNPROCESSABLE")
	stop := func(tb testing.TB, a *api, admin, id string) {
		tb.Helper()
		res := a.mustPost(tb, admin, `mutation($id: ID!) { stopInstance(input: {id: $id}) { userErrors { code } } }`, map[string]any{"id": id})
		if got := authzOutcome(res, "Mutation.stopInstance"); got != ok {
			tb.Fatalf("stop %s: %s", id, res.Raw)
		}
	}
	// Each deleteImage cell deletes a snapshot of its own, made in the region for it.
	snapshots := map[string]string{} // own instance → its snapshot
	snapshot := func(tb testing.TB, a *api, _, own string) {
		tb.Helper()
		snapshots[own] = regionSnapshot(tb, a)
	}
	//                                                       none    expired wrongKey otherOrg viewer     operator   member     admin
	cases := []authzCase{
		{field: "Query.me", doc: `{ me { subject } }`, want: authzRow{unauth, unauth, unauth, ok, ok, ok, ok, ok}},
		{field: "Query.regions", doc: `{ regions { id } }`, want: authzRow{unauth, unauth, unauth, ok, ok, ok, ok, ok}},
		{field: "Query.flavors", doc: `{ flavors { id } }`, want: authzRow{unauth, unauth, unauth, ok, ok, ok, ok, ok}},
		{field: "Query.images", doc: `{ images { id } }`, want: authzRow{unauth, unauth, unauth, ok, ok, ok, ok, ok}},
		{field: "Query.networks", doc: `{ networks(organizationId: "acme", projectId: "web") { id } }`,
			want: authzRow{unauth, unauth, unauth, empty, ok, ok, ok, ok}},
		{field: "Query.securityGroups", doc: `{ securityGroups(networkId: "net-acme-web-eu") { id } }`,
			want: authzRow{unauth, unauth, unauth, empty, ok, ok, ok, ok}},
		{field: "Query.sshCertificateAuthorities", doc: `{ sshCertificateAuthorities(organizationId: "acme", projectId: "web") { id } }`,
			want: authzRow{unauth, unauth, unauth, empty, ok, ok, ok, ok}},
		{field: "Query.instance", doc: `query($id: ID!) { instance(id: $id) { id } }`, vars: authzID,
			want: authzRow{unauth, unauth, unauth, nf, ok, ok, ok, ok}},
		{field: "Query.node", doc: `query($id: ID!) { node(id: $id) { id } }`, vars: authzID,
			want: authzRow{unauth, unauth, unauth, nf, ok, ok, ok, ok}},
		{field: "Query.instances", doc: `{ instances(organizationId: "acme") { totalCount edges { node { id } } } }`,
			want: authzRow{unauth, unauth, unauth, nf, ok, ok, ok, ok}},
		{field: "Query.quota", doc: `{ quota(organizationId: "acme") { organizationId limits { kind limit used } } }`,
			want: authzRow{unauth, unauth, unauth, nf, ok, ok, ok, ok}},
		{field: "Query.instanceSSHKey", doc: `query($id: ID!) { instanceSSHKey(id: $id) { privateKey } }`, vars: authzID,
			want: authzRow{unauth, unauth, unauth, nf, forbidden, unproc, unproc, unproc}},
		{field: "Query.instanceConsoleOutput", doc: `query($id: ID!) { instanceConsoleOutput(id: $id) { text } }`, vars: authzID,
			want: authzRow{unauth, unauth, unauth, nf, forbidden, unproc, unproc, unproc}},
		{field: "Query.instanceEvents", doc: `query($id: ID!) { instanceEvents(id: $id) { edges { node { kind } } } }`, vars: authzID,
			want: authzRow{unauth, unauth, unauth, nf, ok, ok, ok, ok}},

		{field: "Mutation.createInstance", doc: createMutation,
			vars: func(f authzFixture) map[string]any { return map[string]any{"input": createInput(f.name)} },
			want: authzRow{unauth, unauth, unauth, nf, forbidden, forbidden, ok, ok}},
		{field: "Mutation.updateInstance", doc: `mutation($id: ID!) { updateInstance(input: {id: $id, description: "touched"}) { instance { id } userErrors { code } } }`, vars: authzID,
			want: authzRow{unauth, unauth, unauth, nf, forbidden, forbidden, ok, ok}},
		{field: "Mutation.deleteInstance", doc: `mutation($id: ID!) { deleteInstance(input: {id: $id}) { instance { id } userErrors { code } } }`, vars: authzOwnID, own: true,
			want: authzRow{unauth, unauth, unauth, nf, forbidden, forbidden, ok, ok}},
		// Each cell starts an instance of its own that the admin stopped: allowed, it records
		// the intent to run.
		{field: "Mutation.startInstance", doc: `mutation($id: ID!) { startInstance(input: {id: $id}) { instance { id desiredPowerState } userErrors { code } } }`, vars: authzOwnID, own: true, prepare: stop,
			want: authzRow{unauth, unauth, unauth, nf, forbidden, ok, ok, ok}},
		{field: "Mutation.stopInstance", doc: `mutation($id: ID!) { stopInstance(input: {id: $id}) { instance { id desiredPowerState } userErrors { code } } }`, vars: authzOwnID, own: true,
			want: authzRow{unauth, unauth, unauth, nf, forbidden, ok, ok, ok}},
		// The shared instance's server is not built: the verbs that need one are refused.
		{field: "Mutation.rebootInstance", doc: `mutation($id: ID!) { rebootInstance(input: {id: $id}) { instance { id } userErrors { code } } }`, vars: authzID,
			want: authzRow{unauth, unauth, unauth, nf, forbidden, ueUnproc, ueUnproc, ueUnproc}},
		{field: "Mutation.createConsoleSession", doc: `mutation($id: ID!) { createConsoleSession(input: {id: $id}) { consoleSession { url } userErrors { code } } }`, vars: authzID,
			want: authzRow{unauth, unauth, unauth, nf, forbidden, ueUnproc, ueUnproc, ueUnproc}},
		{field: "Mutation.snapshotInstance", doc: `mutation($id: ID!) { snapshotInstance(input: {id: $id, name: "snap"}) { image { id } userErrors { code } } }`, vars: authzID,
			want: authzRow{unauth, unauth, unauth, nf, forbidden, ueUnproc, ueUnproc, ueUnproc}},
		{field: "Mutation.deleteImage", doc: `mutation($id: ID!) { deleteImage(input: {id: $id}) { imageId userErrors { code } } }`,
			vars: func(f authzFixture) map[string]any { return map[string]any{"id": snapshots[f.own]} }, own: true, prepare: snapshot,
			want: authzRow{unauth, unauth, unauth, nf, forbidden, ok, ok, ok}},
		{field: "Mutation.resizeInstance", doc: `mutation($id: ID!) { resizeInstance(input: {id: $id, flavorId: "g1.large", allowRestart: true}) { instance { id } userErrors { code } } }`, vars: authzID,
			want: authzRow{unauth, unauth, unauth, nf, forbidden, forbidden, ueUnproc, ueUnproc}},
		// acme's limit of servers as it already is, so that the admin's call changes nothing.
		{field: "Mutation.setQuota", doc: `mutation { setQuota(input: {organizationId: "acme", limits: [{kind: "servers", limit: 50}]}) { quota { organizationId } userErrors { code } } }`,
			want: authzRow{unauth, unauth, unauth, nf, forbidden, forbidden, forbidden, ok}},

		// Any signed-in caller may ask for a ticket: it stands for the caller, and opens only
		// what the caller's token does.
		{field: "Mutation.createStreamTicket", doc: `mutation { createStreamTicket { ticket } }`,
			want: authzRow{unauth, unauth, unauth, ok, ok, ok, ok, ok}},

		{field: "Subscription.instanceEvents", doc: subQuery("acme", ""),
			want: authzRow{authzClose4401, authzClose4403, authzClose4403, nf, ok, ok, ok, ok}},
	}

	// The table names exactly the schema's root fields.
	listed := map[string]bool{}
	for _, c := range cases {
		if listed[c.field] {
			t.Errorf("%s has more than one entry", c.field)
		}
		listed[c.field] = true
	}
	var missing []string
	for _, f := range authzRootFields() {
		if !listed[f] {
			missing = append(missing, f)
		}
		delete(listed, f)
	}
	if len(missing) > 0 {
		t.Errorf("root fields without an entry in the authorization matrix: %s", strings.Join(missing, ", "))
	}
	if len(listed) > 0 {
		var extra []string
		for f := range listed {
			extra = append(extra, f)
		}
		sort.Strings(extra)
		t.Errorf("entries for fields the schema does not have: %s", strings.Join(extra, ", "))
	}

	audit := &logtest.Recorder{}
	a, s := wsServer(t, withoutRateLimit, func(o *Options) { o.Logger = audit.Logger() })
	admin := a.admin(t)
	other, err := auth.NewKeys([]byte("another-secret-another-secret-an"))
	if err != nil {
		t.Fatal(err)
	}
	acmeAdmin := auth.Principal{Subject: "ada", Grants: []auth.Grant{{OrganizationID: "acme", Role: auth.RoleAdmin}}}
	expired, err := a.keys.Mint(acmeAdmin, time.Now().Add(-2*time.Minute), time.Minute) // expired 60 s ago
	if err != nil {
		t.Fatal(err)
	}
	wrongKey, err := other.Mint(acmeAdmin, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	web := func(r auth.Role) auth.Grant { return auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: r} }
	subjects := [authzColumns]string{authzOtherOrg: "gus", authzViewer: "vic", authzOperator: "otto", authzMember: "mia", authzAdmin: "ada"}
	tokens := [authzColumns]string{
		authzNone:     "",
		authzExpired:  expired,
		authzWrongKey: wrongKey,
		authzOtherOrg: a.token(t, subjects[authzOtherOrg], auth.Grant{OrganizationID: "globex", Role: auth.RoleAdmin}),
		authzViewer:   a.token(t, subjects[authzViewer], web(auth.RoleViewer)),
		authzOperator: a.token(t, subjects[authzOperator], web(auth.RoleOperator)),
		authzMember:   a.token(t, subjects[authzMember], web(auth.RoleMember)),
		authzAdmin:    a.token(t, subjects[authzAdmin], auth.Grant{OrganizationID: "acme", Role: auth.RoleAdmin}),
	}
	shared := a.mustCreate(t, admin, createInput("shared")).ID

	var got []authzRow
	for _, c := range cases {
		var row authzRow
		for col, tok := range tokens {
			who := authzColumnNames[col]
			t.Run(c.field+"/"+who, func(t *testing.T) {
				fx := authzFixture{shared: shared, name: "cell-" + strings.ToLower(strings.ReplaceAll(c.field, ".", "-")) + "-" + strings.ToLower(who)}
				if c.own {
					fx.own = a.mustCreate(t, admin, createInput(fx.name)).ID
					if c.prepare != nil {
						c.prepare(t, a, admin, fx.own)
					}
				}
				refusal := slices.Contains(authzRefusals, c.want[col])
				var before map[string]string
				if refusal {
					before = a.storeState(t)
				}
				if strings.HasPrefix(c.field, "Subscription.") {
					row[col] = authzSubscriptionOutcome(t, s, tok, c.doc)
				} else {
					var vars map[string]any
					if c.vars != nil {
						vars = c.vars(fx)
					}
					mark := audit.Mark()
					res := a.post(t, tok, c.doc, vars)
					row[col] = authzOutcome(res, c.field)
					if row[col] != c.want[col] {
						t.Logf("body: %s", res.Raw)
					}
					if strings.HasPrefix(c.field, "Mutation.") {
						checkAudit(t, audit.Since(mark, "audit"), c.field, subjects[col], row[col], vars)
					} else if got := audit.Since(mark, "audit"); len(got) != 0 {
						t.Errorf("a query was audited: %v", got)
					}
				}
				if row[col] != c.want[col] {
					t.Errorf("%s as %s: got %s, want %s", c.field, who, row[col], c.want[col])
				}
				if refusal {
					if after := a.storeState(t); !reflect.DeepEqual(before, after) {
						t.Errorf("%s as %s was refused but changed the store: %s", c.field, who, authzStateDiff(before, after))
					}
				}
			})
		}
		got = append(got, row)
	}
	if t.Failed() || testing.Verbose() {
		var b strings.Builder
		fmt.Fprintf(&b, "%-32s", "")
		for _, n := range authzColumnNames {
			fmt.Fprintf(&b, " %-16s", n)
		}
		for i, row := range got {
			fmt.Fprintf(&b, "\n%-32s", cases[i].field)
			for _, cell := range row {
				fmt.Fprintf(&b, " %-16s", cell)
			}
		}
		t.Logf("outcomes:\n%s", b.String())
	}
}

// authzStateDiff names the keys that differ between two storeState results.
func authzStateDiff(before, after map[string]string) string {
	var diff []string
	for k, v := range after {
		if w, ok := before[k]; !ok {
			diff = append(diff, "+"+k)
		} else if w != v {
			diff = append(diff, "~"+k)
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			diff = append(diff, "-"+k)
		}
	}
	sort.Strings(diff)
	return strings.Join(diff, " ")
}

// TestSubscriberScope: a subscription delivers only what its subscriber may read. A
// viewer of acme/web subscribed to acme gets acme/web's events and none of acme/data's;
// a subscriber of globex gets none of acme's and cannot subscribe to acme, not even by
// resuming after one of acme's cursors. Every event of one organization comes in log
// order, so an unwanted event would arrive before the subscriber's own marker event that was
// committed after it: no waiting for silence.
func TestSubscriberScope(t *testing.T) {
	for _, proto := range wsProtocols {
		t.Run(proto, func(t *testing.T) {
			a, s := wsServer(t, withoutRateLimit)
			admin := a.admin(t)
			onData := map[string]any{"projectId": "data", "networkId": "net-acme-data-eu"}
			webInst := a.mustCreate(t, admin, createInput("web1"))
			dataInst := a.mustCreate(t, admin, with("data1", onData))
			globexInst := a.mustCreate(t, admin, with("g1", map[string]any{"organizationId": "globex", "projectId": "prod", "networkId": "net-globex-prod-eu"}))
			viewer := a.token(t, "vic", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleViewer})
			globex := a.token(t, "gus", auth.Grant{OrganizationID: "globex", Role: auth.RoleAdmin})

			// Narrowing to what the viewer cannot read is not found, not an empty stream.
			for _, q := range []string{
				`subscription { instanceEvents(organizationId: "acme", projectId: "data") { kind } }`,
				`subscription { instanceEvents(organizationId: "acme", instanceId: "` + dataInst.ID + `") { kind } }`,
			} {
				c := subscribeWS(t, s, proto, viewer, q)
				if codes, m := c.opErrorCodes(); !reflect.DeepEqual(codes, []string{"NOT_FOUND"}) {
					t.Errorf("%s: codes %q, message %s %s", q, codes, m.Type, m.Payload)
				}
				c.stop()
			}

			vsub := subscribeWS(t, s, proto, viewer, subQuery("acme", ""))
			gsub := subscribeWS(t, s, proto, globex, subQuery("globex", ""))
			snap := vsub.event()
			if snap.Kind != "SNAPSHOT" || snap.Instance.ID != webInst.ID {
				t.Fatalf("acme/web viewer's first event %+v, want the SNAPSHOT of %s", snap, webInst.ID)
			}
			vsub.synced()
			// globex cannot subscribe to acme, also not by resuming after a cursor of acme's
			// (which reads no snapshot, so only the organization check refuses it).
			for _, after := range []string{"", snap.Cursor} {
				c := subscribeWS(t, s, proto, globex, subQuery("acme", after))
				if codes, m := c.opErrorCodes(); !reflect.DeepEqual(codes, []string{"NOT_FOUND"}) {
					t.Errorf("globex subscribing to acme after %q: codes %q, message %s %s", after, codes, m.Type, m.Payload)
				}
				c.stop()
			}
			if ev := gsub.event(); ev.Kind != "SNAPSHOT" || ev.Instance.ID != globexInst.ID {
				t.Fatalf("globex subscriber's first event %+v, want the SNAPSHOT of %s", ev, globexInst.ID)
			}
			gsub.synced()

			// acme/data changes of every kind: created, updated, acted on, deleted.
			data2 := a.mustCreate(t, admin, with("data2", onData))
			a.describe(t, admin, dataInst.ID, "changed")
			a.mustPost(t, admin, `mutation($id: ID!) { stopInstance(input: {id: $id}) { instance { id } } }`, map[string]any{"id": dataInst.ID})
			a.mustDelete(t, admin, data2.ID)
			// The viewer's marker, after them in acme's log: nothing before it (also no snapshot
			// of acme/data) may have been delivered.
			a.describe(t, admin, webInst.ID, "marker")
			if ev := vsub.event(); ev.Kind != "UPDATED" || ev.Instance.ID != webInst.ID {
				t.Errorf("acme/web viewer got %s of %s (%s) before its marker, want the UPDATED of %s", ev.Kind, ev.Instance.ID, ev.Instance.Name, webInst.ID)
			}
			// The feed has delivered all of acme's changes above (the viewer got the last one);
			// the globex subscriber's own marker comes after them.
			a.describe(t, admin, globexInst.ID, "marker")
			if ev := gsub.event(); ev.Kind != "UPDATED" || ev.Instance.ID != globexInst.ID {
				t.Errorf("globex subscriber got %s of %s (%s) before its marker, want the UPDATED of %s", ev.Kind, ev.Instance.ID, ev.Instance.Name, globexInst.ID)
			}
			vsub.stop()
			gsub.stop()
		})
	}
}
