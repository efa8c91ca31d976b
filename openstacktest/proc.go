package openstacktest

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
	"time"
)

// proc is one long-running child process of the control plane. It is started in a process
// group of its own (its PID is the group's id), so that stopping it also stops the workers it
// forks (uwsgi's, neutron-server's, the Erlang VM's helpers) and nothing else on the machine.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// run runs a command to completion (database migrations, keystone-manage, nova-manage),
// with its output appended to the log file named after it; the error carries the output's
// tail.
func (c *Cloud) run(ctx context.Context, logName string, env []string, bin string, args ...string) error {
	logPath := filepath.Join(c.Dir, "logs", logName+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "+ %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	cmd.Dir = c.Dir
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, tail(logPath, 30))
	}
	return nil
}

// start launches a long-running service with its output in logs/<name>.log.
func (c *Cloud) start(name string, env []string, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(c.Dir, "logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Dir = c.Dir
	cmd.Stdout, cmd.Stderr = f, f
	// Pdeathsig: should the test binary die without its cleanups, the service dies with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, logPath: logPath, cmd: cmd, exited: make(chan struct{})}
	go func() { p.waitErr = cmd.Wait(); close(p.exited) }()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// alive reports an error when the process has exited, with the tail of its log.
func (p *proc) alive() error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s exited (%v):\n%s", p.name, p.waitErr, tail(p.logPath, 40))
	default:
		return nil
	}
}

// stopAll sends SIGTERM to every process group in procs, waits for them all up to grace,
// then SIGKILLs the groups still there and waits for their leaders.
func stopAll(procs []*proc, grace time.Duration) {
	for _, p := range procs {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	}
	deadline := time.After(grace)
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-deadline:
		}
	}
	for _, p := range procs {
		// The leader may be gone while workers of its group linger: kill the group either way.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// waitHTTP polls url until it answers one of the statuses an OpenStack API gives an
// anonymous GET of its root (200, 300 for a version list, 401), the process exits, or ctx
// ends.
func waitHTTP(ctx context.Context, p *proc, url string) error {
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		if err := p.alive(); err != nil {
			return err
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			switch resp.StatusCode {
			case 200, 300, 401:
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer %s in time (last: %v):\n%s", p.name, url, errOrStatus(err, resp), tail(p.logPath, 40))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func errOrStatus(err error, resp *http.Response) string {
	if err != nil {
		return err.Error()
	}
	return resp.Status
}

// poll calls check every interval until it returns nil, p (when not nil) exits, or ctx ends.
func poll(ctx context.Context, interval time.Duration, what string, p *proc, check func() error) error {
	for {
		if p != nil {
			if err := p.alive(); err != nil {
				return err
			}
		}
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("%s: not ready in time: %v", what, err)
			if p != nil {
				msg += "\n" + tail(p.logPath, 40)
			}
			return errors.New(msg)
		case <-time.After(interval):
		}
	}
}

// waitTCP polls until addr accepts a connection.
func waitTCP(ctx context.Context, p *proc, addr string) error {
	return poll(ctx, 200*time.Millisecond, addr, p, func() error {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		return conn.Close()
	})
}

// parallel runs the functions concurrently and returns the first error, after all returned.
func parallel(fns ...func() error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(fns))
	for i, fn := range fns {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = fn() }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// freePorts reserves n distinct loopback ports by listening on them all at once, then frees
// them for the services. Another process may take one in between; the service then fails to
// bind and Start reports it.
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "--- " + filepath.Base(path) + " (last " + strconv.Itoa(len(lines)) + " lines)\n" + string(bytes.Join(lines, []byte("\n")))
}
