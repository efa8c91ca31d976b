package bench

import (
	"bufio"
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestAnnounced(t *testing.T) {
	tests := []struct {
		line       string
		what, addr string
		ok         bool
	}{
		{`time=2026-11-22T00:27:05.1Z level=INFO msg=serving role=api addr=127.0.0.1:41234`, servingAPI, "127.0.0.1:41234", true},
		{`time=2026-11-22T00:27:05.1Z level=INFO msg=serving flag=--pprof addr=127.0.0.1:6060`, servingPprof, "127.0.0.1:6060", true},
		{`time=t level=INFO msg="serving pprof" addr=127.0.0.1:6060`, "serving pprof", "127.0.0.1:6060", true},
		{`time=t level=INFO msg=serving role=api addr="[::1]:8080"`, servingAPI, "[::1]:8080", true},
		{`{"time":"2026-11-22T00:30:04.35Z","level":"INFO","msg":"serving","role":"api","addr":"127.0.0.1:45485"}`, servingAPI, "127.0.0.1:45485", true},
		{`{"time":"t","level":"INFO","msg":"serving","flag":"--pprof","addr":"127.0.0.1:41319"}`, servingPprof, "127.0.0.1:41319", true},
		{`{"time":"t","level":"INFO","msg":"stopped","role":"api"}`, "", "", false},
		{`{"msg":"serving","addr":`, "", "", false},
		// A key that ends in "addr" is not addr.
		{`time=t level=INFO msg=connected redisaddr=127.0.0.1:6379`, "", "", false},
		{`time=t level=INFO msg=stopped role=api`, "", "", false},
		{`time=t level=INFO msg=serving addr=`, "", "", false},
		{`time=t level=INFO msg="unterminated addr=1.2.3.4:5`, "", "", false},
		{`panic: runtime error`, "", "", false},
	}
	for _, tt := range tests {
		what, addr, ok := announced(tt.line)
		if ok != tt.ok || ok && (what != tt.what || addr != tt.addr) {
			t.Errorf("announced(%q) = %q, %q, %v; want %q, %q, %v", tt.line, what, addr, ok, tt.what, tt.addr, tt.ok)
		}
	}
}

func TestChildEnv(t *testing.T) {
	got := childEnv([]string{"PATH=/bin", "COMPUTEQL_REDIS=redis://x", "HOME=/h", "COMPUTEQL_REGION_FAULTS={}", "XCOMPUTEQL_A=1"})
	want := []string{"PATH=/bin", "HOME=/h", "XCOMPUTEQL_A=1"}
	if !slices.Equal(got, want) {
		t.Errorf("childEnv = %v, want %v", got, want)
	}
}

func TestParseMemory(t *testing.T) {
	const metrics = `# HELP go_memstats_heap_inuse_bytes Number of heap bytes that are in use.
# TYPE go_memstats_heap_inuse_bytes gauge
go_memstats_heap_inuse_bytes 1.2345678e+07
go_memstats_heap_inuse_bytes_total 99
go_memstats_stack_inuse_bytes 655360
process_resident_memory_bytes 4.6243840e+07
computeql_requests_total{op="create"} 12
`
	m, err := parseMemory(strings.NewReader(metrics))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Memory{RSS: 46243840, Heap: 12345678, Stacks: 655360}); m != want {
		t.Errorf("parseMemory = %+v, want %+v", m, want)
	}
	if _, err := parseMemory(strings.NewReader("go_memstats_heap_inuse_bytes 1\n")); err == nil || !strings.Contains(err.Error(), "lacks 2") {
		t.Errorf("missing gauges: err = %v", err)
	}
}

// A line is read once it is whole, however many writes it took.
func TestLogLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	lines := logLines{r: bufio.NewReader(r)}
	var got []string
	for _, write := range []string{"one\ntw", "", "o\nthree", "\n\nfour"} {
		if _, err := f.WriteString(write); err != nil {
			t.Fatal(err)
		}
		lines.read(func(line string) { got = append(got, line) })
	}
	if want := []string{"one", "two", "three", ""}; !slices.Equal(got, want) {
		t.Errorf("lines %q, want %q", got, want)
	}
}

// The announcements are found in the log file, and a process that exits first, or a wait
// cut short, is a failure.
func TestAwaitAnnouncements(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.log")
	log := `{"msg":"starting"}` + "\n" + `{"msg":"serving","addr":"127.0.0.1:8080"}` + "\n" +
		`{"msg":"serving","flag":"--pprof","addr":"127.0.0.1:6060"}` + "\n"
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs, err := awaitAnnouncements(t.Context(), path, []string{servingAPI, servingPprof}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{servingAPI: "127.0.0.1:8080", servingPprof: "127.0.0.1:6060"}; !maps.Equal(addrs, want) {
		t.Errorf("addresses %v, want %v", addrs, want)
	}

	exited := make(chan struct{})
	close(exited)
	if _, err := awaitAnnouncements(t.Context(), path, []string{"serving --metrics"}, exited); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("a process that exited: err %v, want it to say so", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := awaitAnnouncements(ctx, path, []string{"serving --metrics"}, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled wait: err %v, want context.Canceled", err)
	}
}
