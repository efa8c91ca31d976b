package app

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/logtest"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region/sim"
)

const secret = "main-test-secret-main-test-secret"

func TestTokenMintsAVerifiableToken(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), []string{"token", "--token-secret", secret, "--subject", "ci", "--org", "acme", "--project", "web", "--role", "OPERATOR", "--ttl", "5m"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := auth.NewKeys([]byte(secret))
	p, err := keys.Verify(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatal(err)
	}
	want := auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleOperator}
	if p.Subject != "ci" || len(p.Grants) != 1 || p.Grants[0] != want {
		t.Errorf("principal = %+v", p)
	}
}

func TestTokenRefusesBadArguments(t *testing.T) {
	for name, args := range map[string][]string{
		"no secret":     {"token", "--subject", "s", "--org", "acme"},
		"short secret":  {"token", "--token-secret", "short", "--subject", "s", "--org", "acme"},
		"no subject":    {"token", "--token-secret", secret, "--org", "acme"},
		"bad role":      {"token", "--token-secret", secret, "--subject", "s", "--org", "acme", "--role", "root"},
		"project admin": {"token", "--token-secret", secret, "--subject", "s", "--org", "acme", "--project", "web", "--role", "admin"},
		"unknown cmd":   {"frobnicate"},
		"api alone":     {"api"},
	} {
		if err := Run(context.Background(), args, io.Discard); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestSecretFromEnvironment(t *testing.T) {
	t.Setenv("COMPUTEQL_TOKEN_SECRET", secret)
	var out bytes.Buffer
	if err := Run(context.Background(), []string{"token", "--subject", "s", "--org", "acme"}, &out); err != nil {
		t.Fatal(err)
	}
	keys, _ := auth.NewKeys([]byte(secret))
	if _, err := keys.Verify(strings.TrimSpace(out.String())); err != nil {
		t.Errorf("token not signed with the environment's secret: %v", err)
	}
}

// TestFlagsFromEnvironment: an environment variable replaces a flag's default, the command
// line wins over it, and a malformed value is an error naming the variable.
func TestFlagsFromEnvironment(t *testing.T) {
	tests := []struct {
		env, args []string
		want      float64
		wantErr   string
	}{
		{env: nil, want: 50},
		{env: []string{"COMPUTEQL_RATE_LIMIT", "7.5"}, want: 7.5},
		{env: []string{"COMPUTEQL_RATE_LIMIT", "7.5"}, args: []string{"--rate-limit", "3"}, want: 3},
		{env: []string{"COMPUTEQL_RATE_LIMIT", "fast"}, wantErr: "COMPUTEQL_RATE_LIMIT"},
	}
	for _, tt := range tests {
		if tt.env != nil {
			t.Setenv(tt.env[0], tt.env[1])
		}
		var c config
		fs, err := flags("test", &c)
		if err == nil {
			err = fs.Parse(tt.args)
		}
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("env %v: err %v, want one naming %s", tt.env, err, tt.wantErr)
			}
		case err != nil || c.rateLimit != tt.want:
			t.Errorf("env %v args %v: rate limit %v (%v), want %v", tt.env, tt.args, c.rateLimit, err, tt.want)
		}
	}
}

// embedded is the all-in-one role on the embedded Redis, running for one test.
type embedded struct {
	graphqlURL, token string
	cancel            context.CancelFunc
	done              chan error
}

// runEmbedded starts run with args and waits for the welcome text, the event that says the
// server is listening, to read the URL and the admin token from it.
func runEmbedded(t *testing.T, args ...string) *embedded {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &embedded{cancel: cancel, done: make(chan error, 1)}
	t.Cleanup(func() {
		cancel()
		<-e.done
	})
	pr, pw := io.Pipe()
	go func() {
		err := Run(ctx, append([]string{"--listen", "127.0.0.1:0", "--token-secret", secret}, args...), pw)
		pw.Close()
		e.done <- err
	}()
	sc := bufio.NewScanner(pr)
	urlRe := regexp.MustCompile(`GraphQL:\s+(http://\S+)`)
	for e.token == "" && sc.Scan() {
		line := sc.Text()
		if m := urlRe.FindStringSubmatch(line); m != nil {
			e.graphqlURL = m[1]
		}
		if s := strings.TrimSpace(line); strings.HasPrefix(s, "ey") {
			e.token = s
		}
	}
	go io.Copy(io.Discard, pr)
	if e.graphqlURL == "" || e.token == "" {
		t.Fatalf("welcome text lacks the URL or token (url %q)", e.graphqlURL)
	}
	return e
}

// post sends one GraphQL query with the admin token and returns the body.
func (e *embedded) post(t *testing.T, query string) string {
	t.Helper()
	body, err := json.Marshal(map[string]string{"query": query})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, e.graphqlURL, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+e.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	got, _ := io.ReadAll(res.Body)
	return string(got)
}

// postData is post's answer without its extensions, which carry the query's cost (and so
// differ from one request to the next).
func (e *embedded) postData(t *testing.T, query string) string {
	t.Helper()
	raw := e.post(t, query)
	var answer map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &answer); err != nil {
		return raw
	}
	delete(answer, "extensions")
	b, err := json.Marshal(answer)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEmbeddedRunServesAndStops is `make run` in miniature: the all-in-one role on the
// embedded Redis prints a working admin token, serves GraphQL with it, and shuts down cleanly
// when its context ends.
func TestEmbeddedRunServesAndStops(t *testing.T) {
	e := runEmbedded(t)
	got := e.postData(t, `mutation { createInstance(input:{organizationId:"globex",projectId:"prod",networkId:"net-globex-prod-eu",name:"demo",flavorId:"g1.small",imageId:"ubuntu-24.04"}) { instance { name } userErrors { code } } }`)
	if want := `{"data":{"createInstance":{"instance":{"name":"demo"},"userErrors":[]}}}`; got != want {
		t.Errorf("create answered %s", got)
	}
	// One registry serves every part's metrics: the API's, the feed's, the queue's and the
	// worker's.
	res, err := http.Get(strings.TrimSuffix(e.graphqlURL, "/graphql") + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, name := range []string{"computeql_graphql_operations_total", "computeql_subscriptions_active", "computeql_queue_inflight", "computeql_reconcile_duration_seconds", "go_goroutines"} {
		if !bytes.Contains(metrics, []byte("\n"+name)) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	e.cancel()
	select {
	case err := <-e.done:
		e.done <- err // for the cleanup
		if err != nil {
			t.Errorf("shutdown: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("did not shut down")
	}
}

// TestIntrospectionFlag: introspection is answered by default and refused with FORBIDDEN
// under --introspection=false, while ordinary queries still work.
func TestIntrospectionFlag(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, `{"data":{"__schema":{"queryType":{"name":"Query"}}}}`},
		{[]string{"--introspection=false"}, `"code":"FORBIDDEN"`},
	}
	for _, tt := range tests {
		e := runEmbedded(t, tt.args...)
		if got := e.postData(t, `{ __schema { queryType { name } } }`); !strings.Contains(got, tt.want) {
			t.Errorf("%v: introspection answered %s, want %s", tt.args, got, tt.want)
		}
		if got := e.postData(t, `{ me { subject } }`); got != `{"data":{"me":{"subject":"demo-admin"}}}` {
			t.Errorf("%v: me answered %s", tt.args, got)
		}
	}
}

// TestAllowedOriginsFlag: --allowed-origins lets the listed browser origins open a WebSocket
// to /graphql, where by default only same-origin pages may; an entry that is not an origin
// stops the process at start, naming it.
func TestAllowedOriginsFlag(t *testing.T) {
	tests := []struct {
		args    []string
		origins map[string]int // Origin header → handshake status
	}{
		{nil, map[string]int{"https://dash.example.com": http.StatusForbidden, "https://evil.example": http.StatusForbidden}},
		{[]string{"--allowed-origins", "https://dash.example.com, https://ops.example.com:8443"}, map[string]int{
			"https://dash.example.com": http.StatusSwitchingProtocols, "https://ops.example.com:8443": http.StatusSwitchingProtocols,
			"https://evil.example": http.StatusForbidden,
		}},
	}
	for _, tt := range tests {
		e := runEmbedded(t, tt.args...)
		wsURL := "ws" + strings.TrimPrefix(e.graphqlURL, "http")
		for origin, want := range tt.origins {
			conn, res, err := (&websocket.Dialer{Subprotocols: []string{"graphql-transport-ws"}}).Dial(wsURL, http.Header{"Origin": {origin}})
			if conn != nil {
				conn.Close()
			}
			if res == nil {
				t.Fatalf("%v: %s: no handshake answer: %v", tt.args, origin, err)
			}
			if res.StatusCode != want {
				t.Errorf("%v: %s: status %d, want %d", tt.args, origin, res.StatusCode, want)
			}
		}
	}
	// Refused at start, Run returns at once; the deadline only ends a run that was not.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := Run(ctx, []string{"--listen", "127.0.0.1:0", "--token-secret", secret, "--allowed-origins", "dash.example.com"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `"dash.example.com" is not an origin`) {
		t.Errorf("a bare host as an origin: %v", err)
	}
}

// TestOpsListener: --ops-listen serves the process's metrics, liveness and readiness apart
// from the API, which is how worker and region processes are watched.
func TestOpsListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	e := runEmbedded(t, "--ops-listen", addr)
	for path, want := range map[string]string{
		"/healthz": "ok\n",
		"/readyz":  "ok\n",
		"/metrics": "\ncomputeql_reconcile_duration_seconds_count",
	} {
		res, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("%s: %d, body lacks %q", path, res.StatusCode, want)
		}
	}
	// The worker's region calls go through the instrumented client: once it has reconciled
	// the demo instance, they are timed.
	e.post(t, `mutation { createInstance(input:{organizationId:"globex",projectId:"prod",networkId:"net-globex-prod-eu",name:"timed",flavorId:"g1.small",imageId:"ubuntu-24.04"}) { userErrors { code } } }`)
	eventually.Holds(t, 10*time.Second, func() bool {
		res, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return strings.Contains(string(body), `computeql_region_call_duration_seconds_count{op="FindServers"}`)
	}, "no region call timed")
	res, err := http.Get("http://" + addr + "/graphql")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("the ops listener answers /graphql with %d, want 404", res.StatusCode)
	}
}

// TestLogFormats: JSON or text as asked, auto is JSON when not writing to a terminal (a file
// here), records below the level are dropped, and an unknown format is refused.
func TestLogFormats(t *testing.T) {
	tests := []struct {
		format  string
		level   slog.Level
		want    string // the start of the info record
		wantErr bool
	}{
		{format: "json", level: slog.LevelInfo, want: `{"time":`},
		{format: "auto", level: slog.LevelInfo, want: `{"time":`},
		{format: "text", level: slog.LevelInfo, want: `time=`},
		{format: "json", level: slog.LevelWarn},
		{format: "xml", wantErr: true},
	}
	for _, tt := range tests {
		f, err := os.Create(filepath.Join(t.TempDir(), "log"))
		if err != nil {
			t.Fatal(err)
		}
		log, err := newLogger(f, tt.format, tt.level)
		if tt.wantErr {
			if err == nil {
				t.Errorf("format %s accepted", tt.format)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		log.Debug("never at info or above")
		log.Info("request", "status", 200)
		f.Close()
		got, _ := os.ReadFile(f.Name())
		if tt.want == "" {
			if len(got) != 0 {
				t.Errorf("%s at %v logged %s", tt.format, tt.level, got)
			}
			continue
		}
		if !strings.HasPrefix(string(got), tt.want) || !strings.Contains(string(got), "request") || strings.Contains(string(got), "never") || strings.Count(string(got), "\n") != 1 {
			t.Errorf("%s at %v logged %q", tt.format, tt.level, got)
		}
	}
}

func TestParseFaults(t *testing.T) {
	f, err := parseFaults(`{"errorRate": 0.3, "slowCalls": "200ms", "failBuildPrefix": "fail-", "duplicateCreates": true}`)
	if err != nil {
		t.Fatal(err)
	}
	if f.ErrorRate != 0.3 || f.SlowCalls != 200*time.Millisecond || f.FailBuildPrefix != "fail-" || !f.DuplicateCreates {
		t.Errorf("faults = %+v", f)
	}
	for _, bad := range []string{`{"errorRat": 1}`, `{"slowCalls": "soon"}`, `not json`} {
		if _, err := parseFaults(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	if f, err := parseFaults(""); err != nil || f != (sim.Faults{}) {
		t.Errorf("no faults: %+v %v", f, err)
	}
}

// TestReadiness: ready while Redis answers; not ready once the process shuts down, nor when
// Redis is gone.
func TestReadiness(t *testing.T) {
	srv, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	rdb := srv.Client(t)
	process, shutDown := context.WithCancel(context.Background())
	defer shutDown()
	ready := readiness(process, rdb)
	ctx := context.Background()

	if err := ready(ctx); err != nil {
		t.Fatalf("not ready with Redis up: %v", err)
	}
	srv.Stop()
	if err := ready(ctx); err == nil {
		t.Error("ready with Redis gone")
	}
	shutDown()
	if err := ready(ctx); err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("readiness during shutdown: %v", err)
	}
}

// TestRedisClientLogsAreStructured: go-redis's own messages become warn records of the
// process's log.
func TestRedisClientLogsAreStructured(t *testing.T) {
	rec := &logtest.Recorder{}
	redisLog{rec.Logger()}.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts", 5)
	got := rec.Since(0, "redis client")
	if len(got) != 1 || got[0].Level != slog.LevelWarn || got[0].Attrs["detail"] != "redis: connection pool: failed to dial after 5 attempts" {
		t.Errorf("logged %v", got)
	}
}

// A port already taken is an error that says what to do about it.
func TestTakenPortSaysHowToListenElsewhere(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = Run(ctx, []string{"--listen", ln.Addr().String(), "--token-secret", secret}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), "--listen 127.0.0.1:8081") {
		t.Errorf("serving on a taken port: %v; want it to say the port is taken and how to listen elsewhere", err)
	}
}

// Help is asked for, not an error: help, -h and a command's -h exit cleanly, help lists the
// commands, and version says what was built.
func TestHelpAndVersion(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in what Run writes to its output
	}{
		{[]string{"help"}, "Commands:"},
		{[]string{"-h"}, "token     mint a bearer token"},
		{[]string{"--help"}, "version   print the version"},
		{[]string{"version"}, "computeql "},
		{[]string{"help", "api"}, "-rate-limit"},
		{[]string{"token", "-h"}, "-subject"},
		{[]string{"worker", "--help"}, "-redis"},
	} {
		var out strings.Builder
		if err := Run(context.Background(), tc.args, &out); err != nil {
			t.Errorf("%v: %v, want no error", tc.args, err)
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("%v wrote %q, want it to contain %q", tc.args, out.String(), tc.want)
		}
	}
	// Each command lists only its own flags: minting a token serves nothing.
	var token strings.Builder
	if err := Run(context.Background(), []string{"token", "-h"}, &token); err != nil {
		t.Fatal(err)
	}
	for _, serving := range []string{"-listen", "-redis", "-rate-limit", "-build-delay"} {
		if strings.Contains(token.String(), serving+" ") {
			t.Errorf("token -h lists the serving flag %s:\n%s", serving, token.String())
		}
	}
	if err := Run(context.Background(), []string{"nonsense"}, io.Discard); err == nil || !strings.Contains(err.Error(), "want all, api") {
		t.Errorf("an unknown command: %v, want an error listing the commands", err)
	}
}

// TestDemoInstances: make run's process (embedded Redis, demo catalogue) starts with the demo
// instances, every one accepted; --demo-instances=false starts empty.
func TestDemoInstances(t *testing.T) {
	const list = `{ a: instances(organizationId: "acme") { totalCount } g: instances(organizationId: "globex") { totalCount } }`
	if got, want := runEmbedded(t).postData(t, list), `{"data":{"a":{"totalCount":3},"g":{"totalCount":1}}}`; got != want {
		t.Errorf("seeded: %s, want %s (all of demoSeeds)", got, want)
	}
	if got, want := runEmbedded(t, "--demo-instances=false").postData(t, list), `{"data":{"a":{"totalCount":0},"g":{"totalCount":0}}}`; got != want {
		t.Errorf("with --demo-instances=false: %s, want %s", got, want)
	}
}

// gogc is the process's GOGC percent in force.
func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// A serving process raises GOGC while its live heap is below the floor, puts it back when it
// stops, and refuses a floor out of range; --heap-floor-mib 0 leaves GOGC alone.
func TestHeapFloor(t *testing.T) {
	old := debug.SetGCPercent(100) // whatever GOGC the tests run with
	t.Cleanup(func() { debug.SetGCPercent(old) })
	before := gogc()
	e := runEmbedded(t, "--demo-instances=false")
	if got := gogc(); got <= before {
		t.Errorf("serving with the default floor: GOGC %d, want above %d", got, before)
	}
	e.cancel()
	if err := <-e.done; err != nil {
		t.Errorf("shutdown: %v", err)
	}
	e.done <- nil // for the cleanup
	if got := gogc(); got != before {
		t.Errorf("after shutdown: GOGC %d, want %d back", got, before)
	}

	off := runEmbedded(t, "--demo-instances=false", "--heap-floor-mib", "0")
	if got := gogc(); got != before {
		t.Errorf("--heap-floor-mib 0: GOGC %d, want %d untouched", got, before)
	}
	off.cancel()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, floor := range []string{"-1", "1048577"} {
		err := Run(ctx, []string{"--listen", "127.0.0.1:0", "--token-secret", secret, "--heap-floor-mib", floor}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--heap-floor-mib") {
			t.Errorf("--heap-floor-mib %s: %v, want an error naming the flag", floor, err)
		}
	}
}
