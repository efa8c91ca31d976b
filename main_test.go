package main

import (
	"bufio"
	"bytes"
	"context"
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

// TestEmbeddedRunServesAndStops is `make run` in miniature: the all-in-one role on the
// embedded Redis prints a working admin token, serves GraphQL with it, and shuts down cleanly
// when its context ends.
func TestEmbeddedRunServesAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--token-secret", secret}, pw)
		pw.Close()
	}()

	// The welcome text is the event that says the server is listening.
	var graphqlURL, token string
	sc := bufio.NewScanner(pr)
	urlRe := regexp.MustCompile(`GraphQL:\s+(http://\S+)`)
	for token == "" && sc.Scan() {
		line := sc.Text()
		if m := urlRe.FindStringSubmatch(line); m != nil {
			graphqlURL = m[1]
		}
		if s := strings.TrimSpace(line); strings.HasPrefix(s, "ey") {
			token = s
		}
	}
	go io.Copy(io.Discard, pr)
	if graphqlURL == "" || token == "" {
		t.Fatalf("welcome text lacks the URL or token (url %q)", graphqlURL)
	}

	body := `{"query":"mutation { createInstance(input:{organizationId:\"globex\",projectId:\"prod\",networkId:\"net-globex-prod-eu\",name:\"demo\",flavorId:\"g1.small\",imageId:\"ubuntu-24.04\"}) { instance { name } userErrors { code } } }"}`
	req, _ := http.NewRequest(http.MethodPost, graphqlURL, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if want := `{"data":{"createInstance":{"instance":{"name":"demo"},"userErrors":[]}}}`; string(got) != want {
		t.Errorf("create answered %s", got)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("shutdown: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("did not shut down")
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
