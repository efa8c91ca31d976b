package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// child is one process of the embedded system: this binary in one of its roles. What it
// logs goes to a file in the run's directory, where a failure can be read.
type child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	// addrs holds the addresses the process announced, by announcement (see announced).
	addrs map[string]string
	// exited is closed when the process has exited; waitErr is then its exit status.
	exited  chan struct{}
	waitErr error
}

// childStartLimit bounds how long a process may take to announce its addresses.
const childStartLimit = 30 * time.Second

// startChild starts exe with args and, when announce names log messages, waits until the
// process has logged an address for each. The environment's COMPUTEQL_ variables are not
// passed on, so that only the benchmark's settings apply; env adds to the environment (for
// what should not show in the process list, such as the token secret).
func startChild(ctx context.Context, exe, name, dir string, args, env []string, announce ...string) (*child, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("%s: log file: %w", name, err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(childEnv(os.Environ()), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logFile.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	cmd.Stdout = logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, logPath: logPath, addrs: map[string]string{}, exited: make(chan struct{})}
	found := make(chan map[string]string, 1)
	// The reader owns the log file and reaps the process: Wait must follow the last read of
	// the pipe.
	go func() {
		r := bufio.NewReader(stderr)
		if len(announce) > 0 {
			readAnnouncements(r, logFile, announce, found)
		}
		// The rest goes to the log file as it comes, unparsed: a process under load logs a
		// line a request, and parsing each would cost the benchmark's own CPU.
		_, _ = io.Copy(logFile, r)
		c.waitErr = cmd.Wait()
		logFile.Close()
		close(c.exited)
	}()
	if len(announce) == 0 {
		return c, nil
	}
	timer := time.NewTimer(childStartLimit)
	defer timer.Stop()
	select {
	case c.addrs = <-found:
		return c, nil
	case <-c.exited:
		return nil, fmt.Errorf("%s exited at start (%v):\n%s", name, c.waitErr, lastLines(logPath, 20))
	case <-timer.C:
		err = fmt.Errorf("%s did not start within %s:\n%s", name, childStartLimit, lastLines(logPath, 20))
	case <-ctx.Done():
		err = ctx.Err()
	}
	return nil, errors.Join(err, c.stop())
}

// readAnnouncements copies log lines to the log file until the lines have announced every
// message of announce, then sends their addresses on found; or until the log ends.
func readAnnouncements(r *bufio.Reader, logFile io.Writer, announce []string, found chan<- map[string]string) {
	addrs := map[string]string{}
	for {
		line, err := r.ReadString('\n')
		_, _ = io.WriteString(logFile, line)
		if msg, addr, ok := announced(strings.TrimSuffix(line, "\n")); ok {
			addrs[msg] = addr
			if hasAll(addrs, announce) {
				found <- addrs
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func hasAll(addrs map[string]string, msgs []string) bool {
	for _, m := range msgs {
		if addrs[m] == "" {
			return false
		}
	}
	return true
}

// Announcements of computeql's processes: the API's address, and that of the listener of
// its --pprof flag.
const (
	servingAPI   = "serving"
	servingPprof = "serving --pprof"
)

// announced reads a log line in either form log/slog writes, JSON or text (key=value,
// values with spaces quoted), and returns what it announces, its message followed by its
// flag attribute when it has one ("serving --pprof"), and its addr, when it has an address.
func announced(line string) (what, addr string, ok bool) {
	var msg, flag string
	if strings.HasPrefix(line, "{") {
		var rec struct {
			Msg  string `json:"msg"`
			Flag string `json:"flag"`
			Addr string `json:"addr"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			return "", "", false
		}
		msg, flag, addr = rec.Msg, rec.Flag, rec.Addr
	} else {
		msg, _ = logValue(line, "msg")
		flag, _ = logValue(line, "flag")
		addr, _ = logValue(line, "addr")
	}
	if msg == "" || addr == "" {
		return "", "", false
	}
	if flag != "" {
		msg += " " + flag
	}
	return msg, addr, true
}

// logValue returns the value of key in a slog text line.
func logValue(line, key string) (string, bool) {
	for rest := line; rest != ""; {
		i := strings.Index(rest, key+"=")
		if i < 0 {
			return "", false
		}
		if i > 0 && rest[i-1] != ' ' {
			rest = rest[i+len(key)+1:]
			continue
		}
		v := rest[i+len(key)+1:]
		if strings.HasPrefix(v, `"`) {
			q, err := strconv.QuotedPrefix(v)
			if err != nil {
				return "", false
			}
			s, err := strconv.Unquote(q)
			return s, err == nil
		}
		if j := strings.IndexByte(v, ' '); j >= 0 {
			v = v[:j]
		}
		return v, true
	}
	return "", false
}

// childEnv is the environment without COMPUTEQL_ variables.
func childEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, "COMPUTEQL_") {
			out = append(out, kv)
		}
	}
	return out
}

// childStopLimit is how long a process may take to shut down after SIGTERM: the roles finish
// in-flight work within 10 s.
const childStopLimit = 15 * time.Second

// stop asks the process to shut down as an operator would (SIGTERM), kills it if it does not
// within childStopLimit, and returns what went wrong.
func (c *child) stop() error {
	select {
	case <-c.exited:
		return fmt.Errorf("%s had exited (%v):\n%s", c.name, c.waitErr, lastLines(c.logPath, 20))
	default:
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop %s: %w", c.name, err)
	}
	timer := time.NewTimer(childStopLimit)
	defer timer.Stop()
	select {
	case <-c.exited:
		if c.waitErr != nil {
			return fmt.Errorf("%s: %w:\n%s", c.name, c.waitErr, lastLines(c.logPath, 20))
		}
		return nil
	case <-timer.C:
		_ = c.cmd.Process.Kill()
		<-c.exited
		return fmt.Errorf("%s did not stop within %s and was killed", c.name, childStopLimit)
	}
}

// lastLines returns the end of a log file, for an error message.
func lastLines(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}
