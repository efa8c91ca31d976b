package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/region"
)

// TestMain removes the computeql command the tests built with the end-to-end harness.
func TestMain(m *testing.M) { harness.Main(m) }

// tinyConfig is a whole run at the smallest sizes that exercise every phase.
func tinyConfig(t *testing.T) Config {
	t.Helper()
	args := []string{
		"--instances", "20", "--probes", "5", "--subscribers", "50", "--workers", "1",
		"--duration", "300ms", "--concurrency", "8", "--create-rate", "50", "--churn-rate", "20",
		"--probe-rate", "20", "--fanout-rate", "20", "--redis-ops", "300", "--pings", "20",
		"--timeout", "30s", "--out", filepath.Join(t.TempDir(), "out"), "--profile", filepath.Join(t.TempDir(), "profiles"),
	}
	cfg, err := parseConfig(args, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.exe = harness.Binary(t)
	return cfg
}

// A whole run, small: every phase measures something, nothing fails, and the report has
// every section, in its three forms.
func TestRun(t *testing.T) {
	cfg := tinyConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, cfg, "computeql bench (test)", &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	data, err := os.ReadFile(filepath.Join(cfg.Out, "latest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		what string
		ok   bool
	}{
		{"no errors", len(r.Errors) == 0},
		{"PINGs timed", r.Limits.Ping.Count == 20},
		{"stream commands counted", r.Limits.XAdd.Ops == 300 && r.Limits.XReadGroup.Ops == 300},
		{"bare handler loaded", r.Limits.Bare.Requests > 0 && r.Limits.BareRate.Requests == 15 && r.Limits.Bare.Errors == 0},
		{"creates at a concurrency", r.Create.Concurrency.Requests > 0 && r.Create.Concurrency.Errors == 0 && r.Create.Concurrency.Concurrency == 8},
		{"three rounds of the bare handler and the create, the median's reported", len(r.Create.Rounds) == 3 &&
			r.Create.Median == medianRound(r.Create.Rounds) && r.Create.Rounds[r.Create.Median].Bare.Requests == r.Limits.Bare.Requests &&
			r.Create.Rounds[r.Create.Median].Create.Requests == r.Create.Concurrency.Requests &&
			r.Create.Rounds[0].Bare.Requests > 0 && r.Create.Rounds[2].Create.Requests > 0},
		{"CPU per request of the bare handler and of a create", r.Limits.Bare.CPU != nil && r.Limits.Bare.CPU.Client > 0 && r.Limits.Bare.CPU.Server > 0 &&
			r.Create.Concurrency.CPU != nil && r.Create.Concurrency.CPU.Client > 0 && r.Create.Concurrency.CPU.Server > 0 && r.Create.Concurrency.CPU.Redis > 0},
		{"creates at a rate", r.Create.Rate.Requests == 15 && r.Create.Rate.Errors == 0},
		{"every instance converged", r.Convergence.Instances == 20 && r.Convergence.Converged == 20 && r.Convergence.Latency.Count == 20},
		{"probe changes reached commit and subscriber", r.Propagation.ProbeChanges == 6 && r.Propagation.Subscriber.Count == 6 &&
			r.Propagation.Commit.Count == r.Propagation.ProbeChanges+r.Propagation.ChurnChanges && r.Propagation.Missing == 0},
		{"every fan-out delivery arrived", r.FanOut.Changes == 6 && r.FanOut.Expected == 60 && r.FanOut.Delivered == 60 && r.FanOut.Commit.Count == 6},
		{"API memory read before and after", r.FanOut.Before.RSS > 0 && r.FanOut.After.RSS > 0 && r.FanOut.After.Heap > 0},
		{"API memory read at twice the subscribers, ten on each of twice the instances", r.FanOut.TwiceSkipped == "" && r.FanOut.Twice != nil &&
			r.FanOut.Twice.Subscribers == 100 && r.FanOut.Twice.Instances == 10 && r.FanOut.Twice.After.RSS > 0 && r.FanOut.Twice.DialSeconds > 0},
		{"per subscriber at twice from the same baseline", r.FanOut.Twice != nil &&
			r.FanOut.Twice.HeapPerSubscriber == float64(r.FanOut.Twice.After.Heap+r.FanOut.Twice.After.Stacks-r.FanOut.Before.Heap-r.FanOut.Before.Stacks)/100 &&
			r.FanOut.Twice.RSSPerSubscriber == float64(r.FanOut.Twice.After.RSS-r.FanOut.Before.RSS)/100},
		{"the benchmark's file limit recorded", r.Machine.FileLimit >= filesNeeded(50)},
		{"machine described", r.Machine.Cores > 0 && r.Machine.Redis != "" && r.Machine.Redis != "unknown"},
		{"profiles of the create, convergence and fan-out runs", len(r.Profiles) == 7},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: no\n%s", c.what, data)
		}
	}
	for _, p := range r.Profiles {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			t.Errorf("profile %s: %v", p, err)
		}
	}
	md, err := os.ReadFile(filepath.Join(cfg.Out, "latest.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, section := range []string{"Limits", "Create", "Convergence", "Propagation", "Fan-out"} {
		for name, s := range map[string]string{"terminal": out.String(), "markdown": string(md)} {
			if !strings.Contains(s, section) {
				t.Errorf("%s output lacks the %s section", name, section)
			}
		}
	}
	if len(r.Figures) == 0 || !strings.Contains(out.String(), "fan-out: change → subscriber") {
		t.Errorf("no figures, or no progress:\n%s", out.String())
	}
}

// Without redis-server the embedded run says what is missing, instead of quietly measuring
// the in-memory stand-in.
func TestRunWithoutRedisServer(t *testing.T) {
	cfg := tinyConfig(t)
	t.Setenv("PATH", t.TempDir())
	err := run(context.Background(), cfg, "computeql bench", &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "needs a real redis-server") {
		t.Fatalf("err = %v, want one saying redis-server is needed", err)
	}
}

func TestPrintCatalog(t *testing.T) {
	var out bytes.Buffer
	if err := Main(context.Background(), []string{"--print-catalog"}, &out); err != nil {
		t.Fatal(err)
	}
	cat, err := region.Parse(out.Bytes())
	if err != nil {
		t.Fatalf("the printed catalogue does not load: %v", err)
	}
	def, err := parseConfig(nil, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	n, ok := cat.Network(def.Network)
	if !ok || n.OrganizationID != def.Org || n.ProjectID != def.Project || !cat.HasProject(def.Org, def.Project) {
		t.Fatalf("the default network %q is not in the default organization and project", def.Network)
	}
	if n.Prefix.Bits() > 16 {
		t.Errorf("network %s is too small for a run's servers", n.Prefix)
	}
	if f, ok := cat.Flavor(def.Flavor); !ok || !f.OfferedIn(n.Region) {
		t.Errorf("flavor %q is not offered in %s", def.Flavor, n.Region)
	}
	if i, ok := cat.Image(def.Image); !ok || !i.OfferedIn(n.Region) {
		t.Errorf("image %q is not offered in %s", def.Image, n.Region)
	}
}
