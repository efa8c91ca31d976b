package harness

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// BinaryEnv names a computeql binary to use instead of building one, e.g. one CI built already.
const BinaryEnv = "COMPUTEQL_E2E_BINARY"

// RaceEnv, set to 1, builds the binary with the race detector, so that a data race in any
// process fails the test that ran it. It is off by default: every package's own tests already
// run under -race, and race-built processes make a run several times slower.
const RaceEnv = "COMPUTEQL_E2E_RACE"

// binary is the computeql command of this test binary, built on first use, so that a run that
// needs none (benchmarks only, or -run matching no test here) never builds it.
var binary struct {
	once      sync.Once
	path, dir string
	err       error
}

// Binary returns the path of the computeql command, building it on the first call.
func Binary(tb testing.TB) string {
	tb.Helper()
	binary.once.Do(func() { binary.path, binary.dir, binary.err = build() })
	if binary.err != nil {
		tb.Fatal(binary.err)
	}
	return binary.path
}

// Main runs the tests of a package that uses the harness, then removes the binary it built.
// Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if binary.dir != "" {
		os.RemoveAll(binary.dir)
	}
	os.Exit(code)
}

// build compiles the module's main package with the go command that runs the tests.
func build() (path, dir string, err error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		return p, "", nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", "", fmt.Errorf("harness: build computeql: %w", err)
	}
	gomod, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", "", fmt.Errorf("harness: find the module: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	if dir, err = os.MkdirTemp("", "computeql-e2e-bin-"); err != nil {
		return "", "", fmt.Errorf("harness: %w", err)
	}
	path = filepath.Join(dir, "computeql")
	args := []string{"build", "-o", path}
	if os.Getenv(RaceEnv) == "1" {
		args = append(args, "-race")
	}
	cmd := exec.Command(goBin, append(args, ".")...)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		os.RemoveAll(dir)
		return "", "", fmt.Errorf("harness: go build in %s: %w\n%s", root, err, out.Bytes())
	}
	return path, dir, nil
}
