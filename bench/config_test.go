package bench

import (
	"io"
	"strings"
	"testing"
	"time"
)

// env is an environment for parseConfig.
func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

func TestParseConfigDefaults(t *testing.T) {
	c, err := parseConfig(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Org: "bench", Project: "load", Network: "bench-net", Flavor: "bench-small", Image: "bench-image",
		Workers: 2, Duration: 5 * time.Second, Concurrency: 64, Rounds: 3, CreateRate: 1000, Instances: 2000,
		ChurnRate: 200, Probes: 100, ProbeRate: 50, Subscribers: 10_000, FanOutRate: 200,
		RedisOps: 20_000, Pings: 2000, Timeout: time.Minute, Out: "bench-results",
	}
	if c != want {
		t.Errorf("defaults:\n got %+v\nwant %+v", c, want)
	}
}

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(Config) bool
		wantErr string // substring; "" for success
	}{
		{name: "flags set sizes", args: []string{"--instances", "50", "--probes", "10", "--subscribers", "500", "--duration", "2s"},
			check: func(c Config) bool {
				return c.Instances == 50 && c.Probes == 10 && c.Subscribers == 500 && c.Duration == 2*time.Second
			}},
		{name: "environment sets a default", env: map[string]string{"COMPUTEQL_SUBSCRIBERS": "2000"},
			check: func(c Config) bool { return c.Subscribers == 2000 }},
		{name: "a flag beats the environment", args: []string{"--workers", "3"}, env: map[string]string{"COMPUTEQL_WORKERS": "1"},
			check: func(c Config) bool { return c.Workers == 3 }},
		{name: "a target with its Redis and secret",
			args:  []string{"--target", "http://127.0.0.1:8080", "--redis", "redis://127.0.0.1:6380/0", "--token-secret", strings.Repeat("s", 32)},
			check: func(c Config) bool { return c.Target == "http://127.0.0.1:8080" && c.RedisURL != "" }},
		{name: "a malformed environment value is an error, not the default", env: map[string]string{"COMPUTEQL_DURATION": "soon"},
			wantErr: "COMPUTEQL_DURATION"},
		{name: "rounds are set", args: []string{"--rounds", "5"}, check: func(c Config) bool { return c.Rounds == 5 }},
		{name: "at least one round", args: []string{"--rounds", "0"}, wantErr: "--rounds must be at least 1"},
		{name: "a target needs its Redis and secret", args: []string{"--target", "http://127.0.0.1:8080"},
			wantErr: "--target needs --redis"},
		{name: "a target is an http URL", args: []string{"--target", "127.0.0.1:8080", "--redis", "redis://x:1", "--token-secret", "s"},
			wantErr: "want an http or https URL"},
		{name: "profiles need the embedded system",
			args:    []string{"--target", "http://h:1", "--redis", "redis://h:2", "--token-secret", "s", "--profile", "p"},
			wantErr: "--profile needs the embedded system"},
		{name: "counting instructions needs the embedded system",
			args:    []string{"--target", "http://h:1", "--redis", "redis://h:2", "--token-secret", "s", "--instructions", "10"},
			wantErr: "--instructions needs the embedded system"},
		{name: "a negative count of instructions", args: []string{"--instructions", "-1"},
			wantErr: "--instructions must not be negative"},
		{name: "a Redis without a target", env: map[string]string{"COMPUTEQL_REDIS": "redis://127.0.0.1:6379"},
			wantErr: "starts its own redis-server"},
		{name: "more subscribers than ten per instance", args: []string{"--instances", "10", "--probes", "5", "--subscribers", "101"},
			wantErr: "--subscribers must be between 10 and 100"},
		{name: "more probes than instances", args: []string{"--instances", "10", "--probes", "11", "--subscribers", "100"},
			wantErr: "--probes must be between 1 and --instances"},
		{name: "every problem at once", args: []string{"--workers", "0", "--duration", "0s"},
			wantErr: "--workers must be at least 1\n--duration must be positive"},
		{name: "stray arguments", args: []string{"now"}, wantErr: `unexpected arguments ["now"]`},
		{name: "unknown flags", args: []string{"--clients", "3"}, wantErr: "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseConfig(tt.args, env(tt.env), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Errorf("config %+v", c)
			}
		})
	}
}
