package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/region/sim"
)

const secret = "main-test-secret-main-test-secret"

func TestTokenMintsAVerifiableToken(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"token", "--token-secret", secret, "--subject", "ci", "--org", "acme", "--project", "web", "--role", "OPERATOR", "--ttl", "5m"}, &out)
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
		if err := run(context.Background(), args, io.Discard); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestSecretFromEnvironment(t *testing.T) {
	t.Setenv("COMPUTEQL_TOKEN_SECRET", secret)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"token", "--subject", "s", "--org", "acme"}, &out); err != nil {
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
		err := run(ctx, append([]string{"--listen", "127.0.0.1:0", "--token-secret", secret}, args...), pw)
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

// TestEmbeddedRunServesAndStops is `make run` in miniature: the all-in-one role on the
// embedded Redis prints a working admin token, serves GraphQL with it, and shuts down cleanly
// when its context ends.
func TestEmbeddedRunServesAndStops(t *testing.T) {
	e := runEmbedded(t)
	got := e.post(t, `mutation { createInstance(input:{organizationId:"globex",projectId:"prod",networkId:"net-globex-prod-eu",name:"demo",flavorId:"g1.small",imageId:"ubuntu-24.04"}) { instance { name } userErrors { code } } }`)
	if want := `{"data":{"createInstance":{"instance":{"name":"demo"},"userErrors":[]}}}`; got != want {
		t.Errorf("create answered %s", got)
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
		if got := e.post(t, `{ __schema { queryType { name } } }`); !strings.Contains(got, tt.want) {
			t.Errorf("%v: introspection answered %s, want %s", tt.args, got, tt.want)
		}
		if got := e.post(t, `{ me { subject } }`); got != `{"data":{"me":{"subject":"demo-admin"}}}` {
			t.Errorf("%v: me answered %s", tt.args, got)
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
