package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
//
// The process writes its log straight to its file. Through a pipe, this process (the load
// generator) would copy every line: a process under load logs a line or two a request, and
// the copying would be counted as the load's cost.
func startChild(ctx context.Context, exe, name, dir string, args, env []string, announce ...string) (*child, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("%s: log file: %w", name, err)
	}
	// The process's own descriptors share the file's offset: its lines never overwrite.
	cmd := exec.Command(exe, args...)
	cmd.Env = append(childEnv(os.Environ()), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	err = cmd.Start()
	logFile.Close() // the process has its own
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, logPath: logPath, addrs: map[string]string{}, exited: make(chan struct{})}
	go func() {
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	if len(announce) == 0 {
		return c, nil
	}
	if c.addrs, err = awaitAnnouncements(ctx, logPath, announce, c.exited); err == nil {
		return c, nil
	}
	select {
	case <-c.exited:
		return nil, fmt.Errorf("%s exited at start (%v):\n%s", name, c.waitErr, lastLines(logPath, 20))
	default:
	}
	return nil, errors.Join(fmt.Errorf("%s: %w:\n%s", name, err, lastLines(logPath, 20)), c.stop())
}

// announcePoll is how often the log file is read for announcements while a process starts: a
// file gives no notice of a write.
const announcePoll = 10 * time.Millisecond

// awaitAnnouncements reads the log file as it grows until its lines have announced every
// message of announce, and returns their addresses; or fails when exited closes first, after
// childStartLimit, or when ctx ends.
func awaitAnnouncements(ctx context.Context, path string, announce []string, exited <-chan struct{}) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	lines := logLines{r: bufio.NewReader(f)}
	addrs := map[string]string{}
	timer := time.NewTimer(childStartLimit)
	defer timer.Stop()
	tick := time.NewTicker(announcePoll)
	defer tick.Stop()
	for {
		lines.read(func(line string) {
			if msg, addr, ok := announced(line); ok {
				addrs[msg] = addr
			}
		})
		if hasAll(addrs, announce) {
			return addrs, nil
		}
		select {
		case <-tick.C:
		case <-exited:
			return nil, errors.New("exited before announcing its addresses")
		case <-timer.C:
			return nil, fmt.Errorf("did not start within %s", childStartLimit)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// logLines reads the lines of a file that another process is writing.
type logLines struct {
	r       *bufio.Reader
	partial string // the start of a line still being written when the file was read
}

// read calls fn with each whole line written since the last read, without its newline.
func (l *logLines) read(fn func(line string)) {
	for {
		line, err := l.r.ReadString('\n')
		if err != nil {
			l.partial += line
			return
		}
		line, l.partial = l.partial+line, ""
		fn(strings.TrimSuffix(line, "\n"))
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

// kill ends the process at once, for one whose work is done and whose shutdown is not what
// is measured: under valgrind, a Go process's handling of SIGTERM trips callgrind.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
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
