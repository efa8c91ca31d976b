package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/auth"
)

// The npm clients live in clients/ with their own package.json and package-lock.json; `make
// clients` (a prerequisite of make test) installs them with npm ci into clients/node_modules.
const clientsDir = "clients"

// scriptTimeout bounds one client script: every step in it has a timeout of its own (15 s),
// and the longest script waits out the server's 10 s initialisation timeout once.
const scriptTimeout = 60 * time.Second

// nodeClients returns the node binary once the pinned client packages are installed. Without
// node or the packages the tests skip, except under CI (CI set), where they fail: CI installs
// both, and a skipped client suite must not pass for a run of it.
func nodeClients(t *testing.T) string {
	t.Helper()
	unavailable := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf(format, args...)
		}
		t.Skipf(format+": npm client suites skipped", args...)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		unavailable("no node on the PATH (Node.js 20 or later)")
		return ""
	}
	raw, err := os.ReadFile(filepath.Join(clientsDir, "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(raw, &pkg); err != nil {
		t.Fatalf("%s/package.json: %v", clientsDir, err)
	}
	for _, name := range slices.Sorted(maps.Keys(pkg.Dependencies)) {
		want := pkg.Dependencies[name]
		raw, err := os.ReadFile(filepath.Join(clientsDir, "node_modules", name, "package.json"))
		if errors.Is(err, os.ErrNotExist) {
			unavailable("%s is not installed in %s/node_modules: run make clients (npm ci --prefix e2e/clients)", name, clientsDir)
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		var installed struct {
			Version string `json:"version"`
		}
		if err := json.Unmarshal(raw, &installed); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if installed.Version != want {
			t.Fatalf("%s %s is installed, package.json pins %s: run make clients (npm ci --prefix e2e/clients)", name, installed.Version, want)
		}
	}
	return node
}

// clientsConfig is what every script reads from COMPUTEQL_CLIENTS.
type clientsConfig struct {
	HTTP         string `json:"http"`
	WS           string `json:"ws"`
	Token        string `json:"token"`
	BadToken     string `json:"badToken"`
	Organization string `json:"organization"`
	Project      string `json:"project"`
	// Prefix starts the names of the instances the scripts create (each adds its own suffix).
	Prefix string `json:"prefix"`
	// CreateInput is createInstance's input for the demo catalogue, but for the name.
	CreateInput map[string]any `json:"createInput"`
}

// runClient runs the script with node against the system and decodes the JSON line it prints
// into out; a script that fails, times out or prints no result fails the test.
func runClient(t *testing.T, node, script string, cfg clientsConfig, out any) {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = clientsDir
	cmd.Env = append(os.Environ(), "COMPUTEQL_CLIENTS="+string(b))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err = cmd.Run()
	t.Logf("node %s: %v", script, time.Since(start).Round(time.Millisecond))
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	last := lines[len(lines)-1]
	if err != nil {
		t.Fatalf("node %s: %v\nresult: %s\nstderr: %s", script, err, last, stderr.String())
	}
	dec := json.NewDecoder(strings.NewReader(last))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		t.Fatalf("node %s printed %q: %v\nstderr: %s", script, last, err, stderr.String())
	}
}

// Shapes of the scripts' results (lib.mjs).
type (
	clientEvent struct {
		Kind   string `json:"kind"`
		Cursor string `json:"cursor"`
		ID     string `json:"id"`   // "" for null
		Name   string `json:"name"` // "" for null
	}
	clientError struct {
		Message string `json:"message"`
		Code    string `json:"code"` // extensions.code; "" for none
	}
	clientClose struct {
		Code   int    `json:"code"`
		Reason string `json:"reason"`
	}
	clientMutation struct {
		ID         string `json:"id"`
		Name       string `json:"name"`
		UserErrors []any  `json:"userErrors"`
	}
	clientSubscription struct {
		BeforeSynced []clientEvent `json:"beforeSynced"`
		Synced       clientEvent   `json:"synced"`
		Live         clientEvent   `json:"live"`
	}
	// wireEntry is what went over which transport (apollo.mjs, urql.mjs).
	wireEntry struct {
		Transport   string       `json:"transport"`
		Method      string       `json:"method"`
		Status      int          `json:"status"`
		ContentType string       `json:"contentType"`
		Operation   string       `json:"operation"`
		Message     string       `json:"message"`
		Closed      *clientClose `json:"closed"`
	}
)

// codes returns the extensions.code of each error ("" for none).
func codes(errs []clientError) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Code
	}
	return out
}

// checkMutation checks createInstance's answer: the instance named name, without user errors.
func checkMutation(t *testing.T, m clientMutation, name string) {
	t.Helper()
	if m.ID == "" || m.Name != name || len(m.UserErrors) != 0 {
		t.Errorf("createInstance: %s, want an instance named %s without userErrors", js(m), name)
	}
}

// checkSubscription checks the snapshot (SNAPSHOT events, among them seed, each with a
// cursor), then SYNCED (no instance), then the CREATED event of the instance the mutation
// created.
func checkSubscription(t *testing.T, s clientSubscription, seed string, created clientMutation) {
	t.Helper()
	var ids []string
	for _, e := range s.BeforeSynced {
		if e.Kind != "SNAPSHOT" || e.Cursor == "" || e.ID == "" {
			t.Errorf("before SYNCED: %s, want only SNAPSHOT events with a cursor and an instance", js(e))
			continue
		}
		ids = append(ids, e.ID)
	}
	if !slices.Contains(ids, seed) {
		t.Errorf("snapshot of %v, want the instance %s among them", ids, seed)
	}
	if s.Synced.Kind != "SYNCED" || s.Synced.Cursor == "" || s.Synced.ID != "" {
		t.Errorf("after the snapshot: %s, want SYNCED with a cursor and no instance", js(s.Synced))
	}
	if l := s.Live; l.Kind != "CREATED" || l.ID != created.ID || l.Name != created.Name || l.Cursor == "" || l.Cursor == s.Synced.Cursor {
		t.Errorf("live event: %s, want CREATED of %s (%s) with a cursor of its own", js(l), created.ID, created.Name)
	}
}

// checkInstance reads the instance over HTTP: the mutation the client sent took effect.
func checkInstance(t *testing.T, sys *system, token, id, name, description string) {
	t.Helper()
	data := sys.graphql(t, token, `query($id: ID!) { instance(id: $id) { name description } }`, map[string]any{"id": id})
	got, _ := data["instance"].(map[string]any)
	if got["name"] != name || got["description"] != description {
		t.Errorf("instance %s over HTTP: %v, want name %q, description %q", id, got, name, description)
	}
}

// TestClients runs real npm GraphQL clients (clients/package.json pins their versions) against
// the whole system: graphql-ws, raw graphql-transport-ws frames with the ws package,
// subscriptions-transport-ws on the legacy graphql-ws protocol, graphql-sse, Apollo Client and
// urql. Each subtest runs one node script (clients/*.mjs), which prints what the library
// observed as one JSON line, and asserts on it. The subtests run at once against one system.
func TestClients(t *testing.T) {
	node := nodeClients(t)
	sys := startSystem(t)
	grant := auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleMember}
	tok := sys.token(t, "carol", grant)
	seed := sys.createInstance(t, tok, "seed", "g1.small")
	otherKeys, err := auth.NewKeys([]byte("not-the-e2e-secret-not-the-e2e-s"))
	if err != nil {
		t.Fatal(err)
	}
	badToken, err := otherKeys.Mint(auth.Principal{Subject: "carol", Grants: []auth.Grant{grant}}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientsConfig{
		HTTP: sys.URL + "/graphql", WS: "ws" + strings.TrimPrefix(sys.URL, "http") + "/graphql",
		Token: tok, BadToken: badToken, Organization: "acme", Project: "web", Prefix: "npm",
		CreateInput: map[string]any{
			"organizationId": "acme", "projectId": "web", "networkId": "net-acme-web-eu",
			"flavorId": "g1.small", "imageId": "ubuntu-24.04",
			"networking": map[string]any{"securityGroupIds": []string{"sg-acme-web-eu-ssh"}, "publicIP": false},
		},
	}

	t.Run("graphql-ws", func(t *testing.T) {
		t.Parallel()
		testGraphQLWSClient(t, sys, node, cfg, seed)
	})
	t.Run("graphql-transport-ws frames", func(t *testing.T) {
		t.Parallel()
		testTransportWSFrames(t, node, cfg)
	})
	t.Run("subscriptions-transport-ws", func(t *testing.T) {
		t.Parallel()
		testLegacyClient(t, sys, node, cfg, seed)
	})
	t.Run("graphql-sse", func(t *testing.T) {
		t.Parallel()
		testSSEClient(t, sys, node, cfg, seed)
	})
	t.Run("apollo", func(t *testing.T) {
		t.Parallel()
		testApolloClient(t, sys, node, cfg, seed)
	})
	t.Run("urql", func(t *testing.T) {
		t.Parallel()
		testURQLClient(t, sys, node, cfg, seed)
	})
}

// testGraphQLWSClient: graphql-ws's createClient with the ws package.
func testGraphQLWSClient(t *testing.T, sys *system, node string, cfg clientsConfig, seed string) {
	type operation struct {
		Results   int  `json:"results"`
		Completed bool `json:"completed"`
		Error     *struct {
			Errors []clientError `json:"errors"`
			Close  *clientClose  `json:"close"`
			Thrown string        `json:"thrown"`
		} `json:"error"`
	}
	type message struct {
		Type     string `json:"type"`
		ID       string `json:"id"`
		Kind     string `json:"kind"`
		Instance string `json:"instance"`
	}
	var got struct {
		Query struct {
			Subject string `json:"subject"`
			operation
		} `json:"query"`
		Mutation struct {
			clientMutation
			Completed bool `json:"completed"`
			Error     any  `json:"error"`
		} `json:"mutation"`
		Subscription struct {
			clientSubscription
			IDsDistinct     bool        `json:"idsDistinct"`
			LiveOnSecond    clientEvent `json:"liveOnSecond"`
			ClientCompleted bool        `json:"clientCompleted"`
			AfterDispose    []message   `json:"afterDispose"`
			Update          struct {
				Description string `json:"description"`
				UserErrors  []any  `json:"userErrors"`
			} `json:"update"`
			UpdatedOnSecond clientEvent `json:"updatedOnSecond"`
			BarrierSubject  string      `json:"barrierSubject"`
			SecondCompleted bool        `json:"secondCompleted"`
		} `json:"subscription"`
		NotFound operation `json:"notFound"`
		NoToken  struct {
			operation
			Closed *clientClose `json:"closed"`
		} `json:"noToken"`
		BadToken struct {
			operation
			Closed *clientClose `json:"closed"`
		} `json:"badToken"`
	}
	runClient(t, node, "graphql-ws.mjs", cfg, &got)

	if q := got.Query; q.Subject != "carol" || q.Results != 1 || !q.Completed || q.Error != nil {
		t.Errorf("query { me }: %s, want one result for carol, then complete", js(q))
	}
	m := got.Mutation
	checkMutation(t, m.clientMutation, "npm-ws")
	if !m.Completed || m.Error != nil {
		t.Errorf("createInstance: completed %v, error %v; want complete", m.Completed, m.Error)
	}
	s := got.Subscription
	if !s.IDsDistinct {
		t.Error("the client gave both subscriptions one id")
	}
	checkSubscription(t, s.clientSubscription, seed, m.clientMutation)
	if s.LiveOnSecond != s.Live {
		t.Errorf("the second subscription got %s, the first %s: want the same event", js(s.LiveOnSecond), js(s.Live))
	}
	// The client's complete: its sink completes, and the server sends nothing more for the id
	// (an event already on its way is no fault), in particular not the later UPDATED, nor a
	// complete of its own.
	if !s.ClientCompleted {
		t.Error("the sink did not complete after the client completed the subscription")
	}
	for _, msg := range s.AfterDispose {
		if msg.Type != "next" || msg.Kind == "UPDATED" && msg.Instance == m.ID {
			t.Errorf("after the client completed the subscription the server sent %s for it", js(msg))
		}
	}
	if u := s.Update; u.Description != "changed over graphql-ws" || len(u.UserErrors) != 0 {
		t.Errorf("updateInstance: %s", js(u))
	}
	if e := s.UpdatedOnSecond; e.Kind != "UPDATED" || e.ID != m.ID {
		t.Errorf("the second subscription after the update: %s, want UPDATED of %s", js(e), m.ID)
	}
	if s.BarrierSubject != "carol" || !s.SecondCompleted {
		t.Errorf("query after the update: %q, second subscription completed: %v", s.BarrierSubject, s.SecondCompleted)
	}
	checkInstance(t, sys, cfg.Token, m.ID, "npm-ws", "changed over graphql-ws")

	// An operation error: the sink's error gets the errors, nothing else comes.
	if nf := got.NotFound; nf.Results != 0 || nf.Completed || nf.Error == nil ||
		!slices.Equal(codes(nf.Error.Errors), []string{"NOT_FOUND"}) {
		t.Errorf("subscription to an unknown organization: %s, want the sink's error with one NOT_FOUND error", js(nf))
	}
	for _, c := range []struct {
		name   string
		got    operation
		closed *clientClose
		want   clientClose
	}{
		{"no token", got.NoToken.operation, got.NoToken.Closed, clientClose{4401, "Unauthorized"}},
		{"bad token", got.BadToken.operation, got.BadToken.Closed, clientClose{4403, "Forbidden"}},
	} {
		if c.got.Results != 0 || c.got.Completed || c.got.Error == nil || c.got.Error.Close == nil || *c.got.Error.Close != c.want {
			t.Errorf("%s: %s, want the sink's error with the close %s", c.name, js(c.got), js(c.want))
		}
		if c.closed == nil || *c.closed != c.want {
			t.Errorf("%s: the client's closed event %s, want %s", c.name, js(c.closed), js(c.want))
		}
	}
}

// testTransportWSFrames: raw frames with the ws package, one check per socket.
func testTransportWSFrames(t *testing.T, node string, cfg clientsConfig) {
	var got map[string]json.RawMessage
	runClient(t, node, "transport-ws-frames.mjs", cfg, &got)
	decode := func(t *testing.T, name string, v any) {
		t.Helper()
		raw, ok := got[name]
		if !ok {
			t.Fatalf("no result for %s", name)
		}
		var failed struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(raw, &failed) == nil && failed.Error != "" {
			t.Fatalf("%s: %s", name, failed.Error)
		}
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatalf("%s: %s: %v", name, raw, err)
		}
	}

	type closed struct {
		Code     int      `json:"code"`
		Reason   string   `json:"reason"`
		MS       int      `json:"ms"`
		Protocol string   `json:"protocol"`
		Messages []string `json:"messages"`
	}
	ack := []string{"connection_ack"}
	for _, c := range []struct {
		name   string
		code   int
		reason string // "" where the protocol leaves the reason to the server
		msgs   []string
	}{
		{"notJSON", 4400, "", ack},
		{"notAnObject", 4400, "", nil},
		{"unknownType", 4400, "", ack},
		{"subscribeWithoutID", 4400, "", ack},
		{"subscribeWithoutPayload", 4400, "", ack},
		{"subscribeBeforeAck", 4401, "Unauthorized", nil},
		{"initWithoutToken", 4401, "Unauthorized", nil},
		{"noSubprotocol", 4406, "Subprotocol not acceptable", nil},
		{"initTimeout", 4408, "Connection initialisation timeout", nil},
		{"duplicateID", 4409, "Subscriber for dup already exists", nil},
		{"secondInit", 4429, "Too many initialisation requests", ack},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r closed
			decode(t, c.name, &r)
			if r.Code != c.code || c.reason != "" && r.Reason != c.reason || c.reason == "" && r.Reason == "" {
				t.Errorf("closed with %d %q, want %d %q", r.Code, r.Reason, c.code, cmp.Or(c.reason, "a reason"))
			}
			wantProtocol := "graphql-transport-ws"
			if c.name == "noSubprotocol" {
				wantProtocol = ""
			}
			if r.Protocol != wantProtocol {
				t.Errorf("subprotocol %q, want %q", r.Protocol, wantProtocol)
			}
			switch c.name {
			case "duplicateID":
				// The first subscription's events, up to SYNCED, and nothing else: the close frame
				// goes out before the socket's operations end, so no complete precedes it.
				msgs := r.Messages
				if len(msgs) < 2 || msgs[0] != "connection_ack" || slices.ContainsFunc(msgs[1:], func(m string) bool { return m != "next" }) {
					t.Errorf("messages before the close: %v, want connection_ack and the first subscription's next messages", r.Messages)
				}
			case "initTimeout":
				// The server's default: 10 s after the handshake (counted here from the open event,
				// a little later).
				if r.MS < 9000 {
					t.Errorf("closed %d ms after the handshake, want the 10 s initialisation timeout", r.MS)
				}
				fallthrough
			default:
				if !slices.Equal(r.Messages, c.msgs) {
					t.Errorf("messages before the close: %v, want %v", r.Messages, c.msgs)
				}
			}
		})
	}

	t.Run("reuseAfterComplete", func(t *testing.T) {
		var r struct {
			Resynced bool         `json:"resynced"`
			Open     bool         `json:"open"`
			Closed   *clientClose `json:"closed"`
			Messages []string     `json:"messages"`
		}
		decode(t, "reuseAfterComplete", &r)
		// The id is free as soon as the server reads the complete: the second subscription
		// works, and is never closed with 4409.
		if !r.Resynced || !r.Open || slices.Contains(r.Messages, "complete") || slices.Contains(r.Messages, "error") {
			t.Errorf("subscribe again after complete with the same id: resynced %v, open %v, closed %s, messages %v; want the snapshot and SYNCED again, no complete nor error",
				r.Resynced, r.Open, js(r.Closed), r.Messages)
		}
	})

	t.Run("pingPong", func(t *testing.T) {
		var r struct {
			Sent       map[string]any `json:"sent"`
			BeforeInit map[string]any `json:"beforeInit"`
			AfterAck   map[string]any `json:"afterAck"`
			Bare       map[string]any `json:"bare"`
			Open       bool           `json:"open"`
			Messages   []string       `json:"messages"`
		}
		decode(t, "pingPong", &r)
		if !reflect.DeepEqual(r.BeforeInit["payload"], r.Sent) {
			t.Errorf("pong before connection_init: %v, want the ping's payload %v", r.BeforeInit, r.Sent)
		}
		if want := map[string]any{"after": "ack"}; !reflect.DeepEqual(r.AfterAck["payload"], want) {
			t.Errorf("pong after connection_ack: %v, want the payload %v", r.AfterAck, want)
		}
		if _, ok := r.Bare["payload"]; ok {
			t.Errorf("pong to a ping without payload: %v, want none", r.Bare)
		}
		if want := []string{"pong", "connection_ack", "pong", "pong"}; !r.Open || !slices.Equal(r.Messages, want) {
			t.Errorf("messages %v, open %v; want %v on an open socket", r.Messages, r.Open, want)
		}
	})

	t.Run("queryThenComplete", func(t *testing.T) {
		var r struct {
			Messages []struct {
				Type    string `json:"type"`
				Subject string `json:"subject"`
			} `json:"messages"`
		}
		decode(t, "queryThenComplete", &r)
		if len(r.Messages) != 2 || r.Messages[0].Type != "next" || r.Messages[0].Subject != "carol" || r.Messages[1].Type != "complete" {
			t.Errorf("query { me }: %s, want next (carol), then complete", js(r.Messages))
		}
	})

	t.Run("errorWithoutComplete", func(t *testing.T) {
		var r struct {
			PayloadIsList bool          `json:"payloadIsList"`
			Errors        []clientError `json:"errors"`
			Messages      []string      `json:"messages"`
			Open          bool          `json:"open"`
		}
		decode(t, "errorWithoutComplete", &r)
		if !r.PayloadIsList || !slices.Equal(codes(r.Errors), []string{"NOT_FOUND"}) {
			t.Errorf("error message: list %v, errors %s; want a list of one NOT_FOUND error", r.PayloadIsList, js(r.Errors))
		}
		// No complete after either error, and the id is free again at once (no 4409).
		if want := []string{"error", "pong", "error", "pong"}; !r.Open || !slices.Equal(r.Messages, want) {
			t.Errorf("messages for the operation and the pings: %v, open %v; want %v on an open socket", r.Messages, r.Open, want)
		}
	})
}

// js renders v as JSON, for messages: the results' pointers print as what they point to.
func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}

// testLegacyClient: subscriptions-transport-ws's SubscriptionClient on the graphql-ws protocol.
func testLegacyClient(t *testing.T, sys *system, node string, cfg clientsConfig, seed string) {
	var got struct {
		Connection struct {
			Acknowledged bool         `json:"acknowledged"`
			Refused      *clientError `json:"refused"`
		} `json:"connection"`
		Query struct {
			Subject   string `json:"subject"`
			Results   int    `json:"results"`
			Completed bool   `json:"completed"`
			Error     any    `json:"error"`
		} `json:"query"`
		Mutation struct {
			clientMutation
			Completed bool `json:"completed"`
			Error     any  `json:"error"`
		} `json:"mutation"`
		Subscription struct {
			clientSubscription
			Error     any      `json:"error"`
			AfterStop []string `json:"afterStop"`
		} `json:"subscription"`
		NotFound struct {
			Errors    []clientError `json:"errors"`
			Data      []any         `json:"data"`
			Completed bool          `json:"completed"`
			Error     any           `json:"error"`
		} `json:"notFound"`
		KeepAlive bool `json:"keepAlive"`
		NoToken   struct {
			Answer struct {
				Acknowledged bool         `json:"acknowledged"`
				Refused      *clientError `json:"refused"`
			} `json:"answer"`
			Messages []string `json:"messages"`
			Close    struct {
				clientClose
				Protocol string `json:"protocol"`
			} `json:"close"`
		} `json:"noToken"`
	}
	runClient(t, node, "legacy-graphql-ws.mjs", cfg, &got)

	if !got.Connection.Acknowledged {
		t.Fatalf("connection: %s, want connection_ack", js(got.Connection))
	}
	if q := got.Query; q.Subject != "carol" || q.Results != 1 || !q.Completed || q.Error != nil {
		t.Errorf("query { me }: %s, want one result for carol, then complete", js(q))
	}
	m := got.Mutation
	checkMutation(t, m.clientMutation, "npm-legacy")
	if !m.Completed || m.Error != nil {
		t.Errorf("createInstance: completed %v, error %v; want complete", m.Completed, m.Error)
	}
	s := got.Subscription
	checkSubscription(t, s.clientSubscription, seed, m.clientMutation)
	if s.Error != nil {
		t.Errorf("subscription error: %v", s.Error)
	}
	// stop is answered with complete, as subscriptions-transport-ws's own server does; an event
	// already on its way may come before it, nothing after it.
	if n := len(s.AfterStop); n == 0 || s.AfterStop[n-1] != "complete" || slices.Contains(s.AfterStop[:n-1], "complete") {
		t.Errorf("messages after stop: %v, want complete last (and once)", s.AfterStop)
	}
	checkInstance(t, sys, cfg.Token, m.ID, "npm-legacy", "")

	// On this protocol an operation refused before it ran is a data message with the errors,
	// then complete.
	if nf := got.NotFound; !slices.Equal(codes(nf.Errors), []string{"NOT_FOUND"}) || !nf.Completed || nf.Error != nil ||
		len(nf.Data) != 1 || nf.Data[0] != nil {
		t.Errorf("subscription to an unknown organization: %s, want one result with a NOT_FOUND error and no data, then complete", js(nf))
	}
	if !got.KeepAlive {
		t.Error("no ka message after connection_ack")
	}
	nt := got.NoToken
	if nt.Answer.Acknowledged || nt.Answer.Refused == nil || nt.Answer.Refused.Message == "" {
		t.Errorf("without a token: %s, want connection_error with a message", js(nt.Answer))
	}
	if !slices.Equal(nt.Messages, []string{"connection_error"}) || nt.Close.clientClose != (clientClose{4401, "Unauthorized"}) ||
		nt.Close.Protocol != "graphql-ws" {
		t.Errorf("without a token: messages %v, close %s; want connection_error, then 4401 Unauthorized on graphql-ws", nt.Messages, js(nt.Close))
	}
}

// testSSEClient: graphql-sse's createClient in distinct connections mode.
func testSSEClient(t *testing.T, sys *system, node string, cfg clientsConfig, seed string) {
	type networkError struct {
		Status int           `json:"status"`
		Errors []clientError `json:"errors"`
		Thrown string        `json:"thrown"`
	}
	var got struct {
		Query struct {
			Subject   string        `json:"subject"`
			Results   int           `json:"results"`
			Completed bool          `json:"completed"`
			Error     *networkError `json:"error"`
		} `json:"query"`
		Mutation struct {
			clientMutation
			Results   int           `json:"results"`
			Completed bool          `json:"completed"`
			Error     *networkError `json:"error"`
		} `json:"mutation"`
		Subscription struct {
			clientSubscription
			ClientCompleted bool          `json:"clientCompleted"`
			Error           *networkError `json:"error"`
		} `json:"subscription"`
		NotFound struct {
			Errors    []clientError `json:"errors"`
			Data      []any         `json:"data"`
			Completed bool          `json:"completed"`
			Error     *networkError `json:"error"`
		} `json:"notFound"`
		NoToken struct {
			Results   int           `json:"results"`
			Completed bool          `json:"completed"`
			Error     *networkError `json:"error"`
		} `json:"noToken"`
	}
	runClient(t, node, "graphql-sse.mjs", cfg, &got)

	if q := got.Query; q.Subject != "carol" || q.Results != 1 || !q.Completed || q.Error != nil {
		t.Errorf("query { me }: %s, want one next event for carol, then complete", js(q))
	}
	m := got.Mutation
	checkMutation(t, m.clientMutation, "npm-sse")
	if m.Results != 1 || !m.Completed || m.Error != nil {
		t.Errorf("createInstance: %d results, completed %v, error %s; want one, then complete", m.Results, m.Completed, js(m.Error))
	}
	s := got.Subscription
	checkSubscription(t, s.clientSubscription, seed, m.clientMutation)
	if !s.ClientCompleted || s.Error != nil {
		t.Errorf("subscription disposed by the client: completed %v, error %s; want complete", s.ClientCompleted, js(s.Error))
	}
	checkInstance(t, sys, cfg.Token, m.ID, "npm-sse", "")
	if nf := got.NotFound; !slices.Equal(codes(nf.Errors), []string{"NOT_FOUND"}) || !nf.Completed || nf.Error != nil ||
		len(nf.Data) != 1 || nf.Data[0] != nil {
		t.Errorf("subscription to an unknown organization: %s, want one next event with a NOT_FOUND error and no data, then complete", js(nf))
	}
	if nt := got.NoToken; nt.Results != 0 || nt.Completed || nt.Error == nil || nt.Error.Status != 401 ||
		!slices.Equal(codes(nt.Error.Errors), []string{"UNAUTHENTICATED"}) {
		t.Errorf("without a token: %s, want the sink's error: a 401 whose body has one UNAUTHENTICATED error", js(nt))
	}
}

// httpAndWS checks a client's wire: the query and the mutation went over HTTP (with status and
// the operation types in that order), the subscription over graphql-transport-ws, whose socket
// the client closed normally once it had unsubscribed.
func httpAndWS(t *testing.T, wire []wireEntry, contentType string) {
	t.Helper()
	var ops, ws []string
	var closes []clientClose
	for _, w := range wire {
		switch w.Transport {
		case "http":
			ops = append(ops, w.Operation)
			if w.Status != 200 || contentType != "" && w.ContentType != contentType {
				t.Errorf("%s over HTTP: %d %s, want 200 %s", w.Operation, w.Status, w.ContentType, contentType)
			}
		case "ws":
			switch {
			case w.Closed != nil:
				closes = append(closes, *w.Closed)
			case w.Message != "ping" && w.Message != "pong": // keep-alives, every 15 s
				ws = append(ws, w.Message)
			}
		}
	}
	if !slices.Equal(ops, []string{"query", "mutation"}) {
		t.Errorf("over HTTP: %v, want the query and the mutation", ops)
	}
	if !slices.Equal(ws, []string{"connection_ack", "next"}) {
		t.Errorf("over the WebSocket: %v, want connection_ack and the subscription's next messages", ws)
	}
	if !slices.Equal(closes, []clientClose{{1000, ""}}) {
		t.Errorf("WebSocket closes: %s, want one normal closure after unsubscribing", js(closes))
	}
}

// testApolloClient: Apollo Client 4 with HttpLink and GraphQLWsLink.
func testApolloClient(t *testing.T, sys *system, node string, cfg clientsConfig, seed string) {
	type thrown struct {
		CombinedGraphQLErrors bool          `json:"combinedGraphQLErrors"`
		Errors                []clientError `json:"errors"`
	}
	var got struct {
		Query struct {
			Subject string  `json:"subject"`
			Error   *thrown `json:"error"`
		} `json:"query"`
		Mutation     clientMutation `json:"mutation"`
		Subscription struct {
			clientSubscription
			Error *thrown `json:"error"`
		} `json:"subscription"`
		Wire    []wireEntry `json:"wire"`
		NoToken struct {
			thrown
			Data any         `json:"data"`
			Wire []wireEntry `json:"wire"`
		} `json:"noToken"`
	}
	runClient(t, node, "apollo.mjs", cfg, &got)

	if got.Query.Subject != "carol" || got.Query.Error != nil {
		t.Errorf("query { me }: %s, want carol", js(got.Query))
	}
	checkMutation(t, got.Mutation, "npm-apollo")
	checkSubscription(t, got.Subscription.clientSubscription, seed, got.Mutation)
	if got.Subscription.Error != nil {
		t.Errorf("subscription error: %s", js(got.Subscription.Error))
	}
	httpAndWS(t, got.Wire, "application/graphql-response+json")
	checkInstance(t, sys, cfg.Token, got.Mutation.ID, "npm-apollo", "")

	// Apollo Client 4 reads the errors of a non-2xx answer only in
	// application/graphql-response+json: the caller gets them as CombinedGraphQLErrors.
	nt := got.NoToken
	if nt.Data != nil || !nt.CombinedGraphQLErrors || !slices.Equal(codes(nt.Errors), []string{"UNAUTHENTICATED"}) {
		t.Errorf("without a token: %s, want CombinedGraphQLErrors with one UNAUTHENTICATED error", js(nt))
	}
	if len(nt.Wire) != 1 || nt.Wire[0].Status != 401 || nt.Wire[0].ContentType != "application/graphql-response+json" {
		t.Errorf("without a token, over HTTP: %s, want one 401 in application/graphql-response+json", js(nt.Wire))
	}
}

// testURQLClient: @urql/core with fetchExchange and subscriptionExchange over graphql-ws.
func testURQLClient(t *testing.T, sys *system, node string, cfg clientsConfig, seed string) {
	type failure struct {
		GraphQLErrors []clientError `json:"graphQLErrors"`
		NetworkError  *string       `json:"networkError"`
		Status        *int          `json:"status"`
	}
	var got struct {
		Query struct {
			Subject string   `json:"subject"`
			Error   *failure `json:"error"`
		} `json:"query"`
		Mutation struct {
			clientMutation
			Error *failure `json:"error"`
		} `json:"mutation"`
		Subscription struct {
			clientSubscription
			Errors []failure `json:"errors"`
		} `json:"subscription"`
		Wire    []wireEntry `json:"wire"`
		NoToken struct {
			Data  any         `json:"data"`
			Error *failure    `json:"error"`
			Wire  []wireEntry `json:"wire"`
		} `json:"noToken"`
		UnhandledAborts int `json:"unhandledAborts"`
	}
	runClient(t, node, "urql.mjs", cfg, &got)
	for _, w := range got.Wire {
		if w.Transport == "http" && w.ContentType != "application/graphql-response+json" {
			// urql's Accept: application/graphql-response+json, application/graphql+json,
			// application/json, text/event-stream, multipart/mixed: the first it lists wins.
			t.Errorf("urql's %s (%s) was answered with %s, not the application/graphql-response+json its Accept lists first", w.Operation, w.Method, w.ContentType)
		}
	}
	if got.UnhandledAborts > 0 {
		t.Errorf("urql aborted %d event stream(s) after reading the result, which a JSON answer never makes it do", got.UnhandledAborts)
	}

	if got.Query.Subject != "carol" || got.Query.Error != nil {
		t.Errorf("query { me }: %s, want carol", js(got.Query))
	}
	checkMutation(t, got.Mutation.clientMutation, "npm-urql")
	if got.Mutation.Error != nil {
		t.Errorf("createInstance: %s", js(got.Mutation.Error))
	}
	checkSubscription(t, got.Subscription.clientSubscription, seed, got.Mutation.clientMutation)
	if len(got.Subscription.Errors) != 0 {
		t.Errorf("subscription errors: %s", js(got.Subscription.Errors))
	}
	// urql's Accept lists text/event-stream after the JSON types, and the server answers it with
	// an event stream, which urql reads as well: the content type is not checked here.
	httpAndWS(t, got.Wire, "")
	checkInstance(t, sys, cfg.Token, got.Mutation.ID, "npm-urql", "")

	nt := got.NoToken
	if nt.Data != nil || nt.Error == nil || !slices.Equal(codes(nt.Error.GraphQLErrors), []string{"UNAUTHENTICATED"}) ||
		nt.Error.NetworkError != nil || nt.Error.Status == nil || *nt.Error.Status != 401 {
		t.Errorf("without a token: %s, want a CombinedError with one UNAUTHENTICATED error from a 401", js(nt.Error))
	}
	if len(nt.Wire) != 1 || nt.Wire[0].Status != 401 {
		t.Errorf("without a token, over HTTP: %s, want one 401", js(nt.Wire))
	}
}
