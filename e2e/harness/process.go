package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/queue"
)

// Role is what a process of the binary does: its subcommand.
type Role string

// The roles of a deployment.
const (
	RoleAPI    Role = "api"
	RoleWorker Role = "worker"
	RoleRegion Role = "region"
)

// TestSecret is the --token-secret of a deployment whose Options give none.
const TestSecret = "e2e-harness-secret-e2e-harness-secret"

// LogsEnv names a directory to keep the processes' logs in, one subdirectory per deployment;
// by default they go to the test's temporary directory and are logged only when it fails.
const LogsEnv = "COMPUTEQL_E2E_LOGS"

// Options configure a Deployment.
type Options struct {
	// Secret signs and verifies bearer tokens (--token-secret). Defaults to TestSecret.
	Secret string
	// Args are given to every api, worker and region process, e.g. --build-delay 100ms.
	Args []string
	// Env is added to every process's environment, e.g. COMPUTEQL_REGION_FAULTS=... . The
	// COMPUTEQL_ variables of the test's own environment are not passed on, so that a
	// developer's settings never change what a test runs.
	Env []string
	// StartTimeout bounds how long a process may take to become ready. Defaults to 30s.
	StartTimeout time.Duration
	// StopTimeout is how long a process may take to exit after SIGTERM before it is killed and
	// the test fails. Defaults to 20s: the worker's own shutdown deadline is 10s.
	StopTimeout time.Duration
}

// Deployment is a set of computeql processes sharing one Redis, owned by a test: when it ends,
// every process still running gets SIGTERM (then SIGKILL), and any that exited on its own, or
// failed to stop cleanly, fails the test.
type Deployment struct {
	Redis *Redis
	bin   string
	opts  Options
	dir   string
	tb    testing.TB

	mu    sync.Mutex
	procs []*Process
	count map[Role]int
}

// NewDeployment returns an empty deployment on the Redis; the binary is built if it was not.
func NewDeployment(tb testing.TB, r *Redis, opts Options) *Deployment {
	tb.Helper()
	if opts.Secret == "" {
		opts.Secret = TestSecret
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 30 * time.Second
	}
	if opts.StopTimeout == 0 {
		opts.StopTimeout = 20 * time.Second
	}
	dir := tb.TempDir()
	if keep := os.Getenv(LogsEnv); keep != "" {
		var err error
		if dir, err = os.MkdirTemp(keep, strings.NewReplacer("/", "_", " ", "_").Replace(tb.Name())+"-"); err != nil {
			tb.Fatal(err)
		}
	}
	d := &Deployment{Redis: r, bin: Binary(tb), opts: opts, dir: dir, tb: tb, count: map[Role]int{}}
	tb.Cleanup(d.stopAll)
	return d
}

// Process is one running (or stopped) process of the binary.
type Process struct {
	Role Role
	// Name is the role and its ordinal in the deployment, e.g. worker-2; its log is Name.log.
	Name string
	// Addr is where the process serves HTTP: an API its --listen address, another role its
	// --ops-listen (/metrics, /healthz, /readyz). It stays the same across restarts.
	Addr string

	d    *Deployment
	args []string
	log  string

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{} // closed when the current run exited
	err      error         // the current run's exit, once done is closed
	stopping bool          // the test asked the current run to stop
}

// API starts an API process on a free loopback port and waits until it is ready.
func (d *Deployment) API(tb testing.TB, args ...string) *Process {
	return d.Start(tb, RoleAPI, args...)
}

// Worker starts a worker process (which also drives the simulated region's clock) and waits
// until it is ready.
func (d *Deployment) Worker(tb testing.TB, args ...string) *Process {
	return d.Start(tb, RoleWorker, args...)
}

// Start starts a process of the role with the deployment's arguments and args, serving HTTP
// on a free loopback port (an API with --listen, another role with --ops-listen), and waits
// until its /readyz answers.
func (d *Deployment) Start(tb testing.TB, role Role, args ...string) *Process {
	tb.Helper()
	d.mu.Lock()
	d.count[role]++
	name := fmt.Sprintf("%s-%d", role, d.count[role])
	d.mu.Unlock()
	p := &Process{Role: role, Name: name, d: d, log: filepath.Join(d.dir, name+".log")}
	p.args = append([]string{string(role), "--redis", d.Redis.URL, "--token-secret", d.opts.Secret}, d.opts.Args...)
	p.args = append(p.args, args...)
	d.mu.Lock()
	d.procs = append(d.procs, p)
	d.mu.Unlock()
	// A free port can be taken by someone else before the process binds it: then it exits,
	// and another port is tried.
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		p.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p.start(tb)
		if p.waitReady(tb) || attempt == 3 || !strings.Contains(p.Log(), "address already in use") {
			break
		}
	}
	select {
	case <-p.Exited():
		tb.Fatalf("harness: %s exited at start: %v\n%s", p.Name, p.ExitErr(), p.Tail(30))
	default:
	}
	return p
}

func (p *Process) start(tb testing.TB) {
	tb.Helper()
	args := p.args
	listen := "--ops-listen"
	if p.Role == RoleAPI {
		listen = "--listen"
	}
	args = append([]string{args[0], listen, p.Addr}, args[1:]...)
	logFile, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	fmt.Fprintf(logFile, "=== harness: %s %s\n", p.d.bin, strings.Join(args, " "))
	cmd := exec.Command(p.d.bin, args...)
	cmd.Env = p.d.env()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = ProcAttr()
	if err := cmd.Start(); err != nil {
		tb.Fatalf("harness: start %s: %v", p.Name, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.err, p.stopping = cmd, done, nil, false
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
}

// waitReady waits until the process answers /readyz, or exits; it reports whether it is ready.
func (p *Process) waitReady(tb testing.TB) bool {
	tb.Helper()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	ready := false
	eventually.Holds(tb, p.d.opts.StartTimeout, func() bool {
		select {
		case <-p.Exited():
			return true
		default:
		}
		resp, err := client.Get(p.URL() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		ready = resp.StatusCode == http.StatusOK
		return ready
	}, "%s answers /readyz", p.Name)
	return ready
}

// URL is the base URL of Addr, e.g. http://127.0.0.1:41234.
func (p *Process) URL() string { return "http://" + p.Addr }

// Client returns a GraphQL client of the API with the token.
func (p *Process) Client(tb testing.TB, token string) *Client {
	return NewClient(tb, p.URL()+"/graphql", token)
}

// Subscribe starts a subscription on the API with the token; see Subscribe.
func (p *Process) Subscribe(tb testing.TB, token, query string, vars map[string]any) *Subscription {
	tb.Helper()
	return Subscribe(tb, "ws://"+p.Addr+"/graphql", token, query, vars)
}

// Pid is the process id of the current run.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// Exited is closed when the current run exits.
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// ExitErr is how the current run exited: nil for status 0; meaningful once Exited is closed.
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Signal sends sig to the current run, which the test then expects to exit.
func (p *Process) Signal(sig os.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopping = true
	return p.cmd.Process.Signal(sig)
}

// Terminate sends SIGTERM and waits for the process to exit, killing it after StopTimeout; it
// returns how it exited (nil: status 0, a clean shutdown).
func (p *Process) Terminate(tb testing.TB) error {
	tb.Helper()
	if err := p.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		tb.Fatalf("harness: SIGTERM %s: %v", p.Name, err)
	}
	select {
	case <-p.Exited():
		return p.ExitErr()
	case <-time.After(p.d.opts.StopTimeout):
	}
	p.Kill(tb)
	return fmt.Errorf("%s did not exit within %s of SIGTERM and was killed", p.Name, p.d.opts.StopTimeout)
}

// Kill sends SIGKILL, as a crash or an OOM kill would end the process, and waits for it to exit.
func (p *Process) Kill(tb testing.TB) {
	tb.Helper()
	if err := p.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		tb.Fatalf("harness: SIGKILL %s: %v", p.Name, err)
	}
	<-p.Exited()
}

// Restart starts the process again with the same arguments and address once it has exited,
// and waits until it is ready.
func (p *Process) Restart(tb testing.TB) {
	tb.Helper()
	select {
	case <-p.Exited():
	default:
		tb.Fatalf("harness: restart %s: it is still running", p.Name)
	}
	p.start(tb)
	if !p.waitReady(tb) {
		tb.Fatalf("harness: %s exited on restart: %v\n%s", p.Name, p.ExitErr(), p.Tail(30))
	}
}

// Log returns everything the process wrote, over all its runs.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// Tail returns the last n lines of the log.
func (p *Process) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// Alive fails the test if a process exited without being asked to.
func (d *Deployment) Alive(tb testing.TB) {
	tb.Helper()
	for _, p := range d.processes() {
		select {
		case <-p.Exited():
			if !p.asked() {
				tb.Fatalf("harness: %s exited on its own: %v\n%s", p.Name, p.ExitErr(), p.Tail(30))
			}
		default:
		}
	}
}

func (p *Process) asked() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopping
}

func (d *Deployment) processes() []*Process {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*Process(nil), d.procs...)
}

// stopAll ends the deployment: every running process is asked to stop with SIGTERM, all at once
// (as an orchestrator stops a deployment), and must exit with status 0. One that had exited on
// its own fails the test. On failure, every process's log tail is logged.
func (d *Deployment) stopAll() {
	procs := d.processes()
	for _, p := range procs {
		select {
		case <-p.Exited():
			if !p.asked() {
				d.tb.Errorf("harness: %s exited on its own: %v", p.Name, p.ExitErr())
			}
		default:
			_ = p.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.After(d.opts.StopTimeout)
	for _, p := range procs {
		select {
		case <-p.Exited():
			if err := p.ExitErr(); err != nil && p.asked() && !killed(err) {
				d.tb.Errorf("harness: %s did not stop cleanly on SIGTERM: %v", p.Name, err)
			}
		case <-deadline:
			d.tb.Errorf("harness: %s did not exit within %s of SIGTERM; killed", p.Name, d.opts.StopTimeout)
			_ = p.Signal(syscall.SIGKILL)
			<-p.Exited()
		}
	}
	for _, p := range procs {
		// A race-built process reports a race and goes on; its exit status says so only at the
		// end, and the report itself is what helps.
		if log := p.Log(); strings.Contains(log, raceReport) {
			report := log[strings.Index(log, raceReport):]
			lines := strings.SplitN(report, "\n", 80)
			d.tb.Errorf("harness: %s had a data race:\n%s", p.Name, strings.Join(lines[:min(len(lines), 79)], "\n"))
		}
	}
	if d.tb.Failed() {
		for _, p := range procs {
			d.tb.Logf("--- %s (last lines of %s)\n%s", p.Name, p.log, p.Tail(40))
		}
	}
}

// raceReport starts the race detector's report of a data race.
const raceReport = "WARNING: DATA RACE"

// killed reports whether a process exited on SIGKILL, which only the test sends.
func killed(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// env is the processes' environment: the test's without its COMPUTEQL_ variables, and Env.
func (d *Deployment) env() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "COMPUTEQL_") {
			out = append(out, kv)
		}
	}
	return append(out, d.opts.Env...)
}

// Token mints a token with the deployment's secret through the binary's token command, as a
// script would: args are the command's flags, e.g. --subject s --grant acme=admin.
func (d *Deployment) Token(tb testing.TB, args ...string) string {
	tb.Helper()
	cmd := exec.Command(d.bin, append([]string{"token", "--token-secret", d.opts.Secret}, args...)...)
	cmd.Env = d.env()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("harness: computeql token %v: %v\n%s", args, err, stderr.Bytes())
	}
	return strings.TrimSpace(string(out))
}

// Holding returns how many queue messages the process's worker has been delivered and not
// finished: work in its hands. Consumers are named host-pid-random.
func (p *Process) Holding(ctx context.Context) (int64, error) {
	q, err := queue.New(p.d.Redis.Client, queue.Options{})
	if err != nil {
		return 0, err
	}
	backlog, err := q.Backlog(ctx)
	if err != nil {
		return 0, fmt.Errorf("harness: pending messages: %w", err)
	}
	mark := "-" + strconv.Itoa(p.Pid()) + "-"
	var n int64
	for _, bl := range backlog {
		for name, count := range bl.PendingBy {
			if strings.Contains(name, mark) {
				n += count
			}
		}
	}
	return n, nil
}
