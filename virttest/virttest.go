// Package virttest starts a private libvirtd for tests, so the libvirt region driver is tested
// against a real daemon and real QEMU guests (under TCG) while the machine running the tests is
// left exactly as it was: no bridges, iptables rules, dnsmasq, libvirt state or processes
// outside the namespaces and temporary directories it creates, and none of those left behind
// once the host is closed — even when the test fails.
//
// A Host is made of:
//
//   - a named network namespace (ip netns add computeql-<random>, lo up), in which libvirt
//     creates its bridges, taps, NAT rules and dnsmasq. Tests reach into it with Host.Dial and
//     Host.Command;
//   - a libvirtd in that network namespace and in a private mount namespace (nsenter --net,
//     then unshare --mount --propagation private), where /run/libvirt, /var/lib/libvirt,
//     /var/cache/libvirt, /var/log/libvirt and /etc/libvirt are bind mounts of directories in
//     the host's temporary directory (one the machine lacks is made inside an overlay of its
//     parent, so not even an empty mount point is created on the machine), /sys is the
//     namespace's own sysfs, and /etc/passwd and /etc/group are private copies when libvirt's
//     QEMU user has to be added;
//   - libvirtd's UNIX sockets in a temporary directory on the shared filesystem, so the test
//     process, outside the mount namespace, connects to Host.URI.
//
// QEMU's output goes straight to files (qemu.conf stdio_handler = "file"), so there is no
// virtlogd to start and stop. Close kills whatever is left by PID, finding the processes by
// their namespaces' inodes, never by name, so other libvirtds on the machine are left alone.
//
// With Options.HostNetwork there is no network namespace: libvirtd and QEMU use the machine's,
// for a client of libvirt such as Nova that plugs guests itself there and defines no libvirt
// network; the mount namespace and directories stay private.
//
// The package is not a _test package so that every test package using libvirt can import it,
// like package redistest. It is Linux-only and needs root, libvirtd, qemu-system-x86_64,
// dnsmasq, iproute2, util-linux and iptables (libvirt's network driver runs iptables and
// ip6tables for NAT networks); Available says what is missing, and Require turns that into a
// skip, or a failure when the environment variable CI is set.
package virttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/computeql/computeql/region/libvirt/dial"
)

// Options configure a Host. The zero value is ready to use; every default is applied in
// Options.withDefaults.
type Options struct {
	// TempDir is the directory under which the host makes its own directory (state, config,
	// logs and, when the path is short enough, sockets); that directory is removed by Close.
	// Default: t.TempDir() in Start, os.TempDir() in Launch. It must not lie under /run,
	// /var/lib, /var/cache, /var/log or /etc, which the mount namespace may overlay.
	TempDir string

	// StartTimeout bounds the wait for libvirtd to answer. Default: 30s (libvirtd probes
	// QEMU's capabilities when it starts, which takes a few seconds under TCG on a busy
	// machine).
	StartTimeout time.Duration

	// StopTimeout bounds Close: destroying the domains and networks through libvirt, then
	// waiting for every process in the namespaces to exit. Default: 20s.
	StopTimeout time.Duration

	// LogLevel is libvirtd's log level, written to LogPath: 1 debug, 2 info, 3 warnings,
	// 4 errors. Default: 3.
	LogLevel int

	// LogTailLines is how many lines of libvirtd's log Start prints when the test has
	// failed and Launch puts in its error when libvirtd did not come up. Default: 60.
	LogTailLines int

	// HostNetwork runs libvirtd, and so QEMU, in the machine's network namespace rather than
	// one of its own (the mount namespace stays private), for a client of libvirt that plugs
	// its guests' interfaces itself in the machine's namespace, or reaches what QEMU listens
	// on there: Nova's libvirt driver makes each guest's tap before libvirt opens it, and its
	// serial console proxy connects to QEMU's TCP serial port. Such a libvirtd must define no
	// network of its own, whose bridge, NAT rules and dnsmasq would be the machine's; Dial and
	// Command then act in the machine's namespace, and Namespace is "".
	HostNetwork bool
}

// withDefaults fills in the defaults documented on Options; tb is nil outside Start.
func (o Options) withDefaults(tb testing.TB) Options {
	if o.TempDir == "" {
		if tb != nil {
			o.TempDir = tb.TempDir()
		} else {
			o.TempDir = os.TempDir()
		}
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 30 * time.Second
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = 20 * time.Second
	}
	if o.LogLevel < 1 || o.LogLevel > 4 {
		o.LogLevel = 3
	}
	if o.LogTailLines <= 0 {
		o.LogTailLines = 60
	}
	return o
}

// Host is a private libvirtd in its own network and mount namespaces.
type Host struct {
	// URI is the libvirt URI of the daemon, qemu:///system?socket=<Socket>, in the form the
	// region's libvirt URI parser accepts.
	URI string
	// Socket is the absolute path of libvirtd's read-write UNIX socket.
	Socket string
	// Dir is the host's own temporary directory. libvirtd sees its subdirectories run, lib,
	// cache, logdir and etc as /run/libvirt (pid files of QEMU and dnsmasq),
	// /var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt (QEMU's output) and
	// /etc/libvirt.
	Dir string
	// LogPath is libvirtd's log, together with its standard output and error.
	LogPath string

	opts    Options
	bins    binaries
	name    string // network namespace name, under /var/run/netns
	netIno  uint64 // inode of the network namespace, to find its processes after it is deleted
	mntIno  uint64 // inode of libvirtd's mount namespace, once it is up; 0 before
	ready   bool   // libvirtd answered, so it may have made domains and networks to destroy
	sockDir string // set when the sockets live outside Dir because Dir's path is too long
	script  string // run by sh inside the new mount namespace: mounts, then exec libvirtd

	cmd     *exec.Cmd
	exited  chan struct{} // closed when libvirtd (our child) has been waited for
	waitErr error         // libvirtd's exit status, valid once exited is closed
	killed  bool          // we sent libvirtd SIGKILL, so waitErr says so and is no crash

	closeOnce sync.Once
	closeErr  error
}

// Require skips the test when the harness cannot run here, unless the environment variable CI
// is set: on CI a missing dependency is a failure, not a silent skip.
func Require(tb testing.TB) {
	tb.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") == "" {
			tb.Skipf("virttest: %v", err)
		}
		tb.Fatalf("virttest: %v (CI is set, so this is a failure)", err)
	}
}

// Start launches a Host for the test (after Require) and closes it when the test ends. If the
// test failed, the tail of libvirtd's log is printed first.
func Start(tb testing.TB, opts Options) *Host {
	tb.Helper()
	Require(tb)
	h, err := launch(context.Background(), opts.withDefaults(tb))
	if err != nil {
		tb.Fatalf("virttest: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("virttest: last lines of %s:\n%s", h.LogPath, h.LogTail())
		}
		if err := h.Close(); err != nil {
			tb.Errorf("virttest: close: %v", err)
		}
	})
	return h
}

// Launch starts a Host and waits until libvirtd answers, for ctx or Options.StartTimeout,
// whichever ends first. ctx only bounds the start: the daemon runs until Close. On error
// everything already made is undone.
func Launch(ctx context.Context, opts Options) (*Host, error) {
	return launch(ctx, opts.withDefaults(nil))
}

func launch(ctx context.Context, opts Options) (*Host, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	bins, err := lookBinaries()
	if err != nil {
		return nil, err
	}
	h := &Host{opts: opts, bins: bins, exited: make(chan struct{})}
	close(h.exited) // nothing to wait for until libvirtd is started
	if err := h.launch(ctx); err != nil {
		tail := h.LogTail()
		// A failed undo's error carries the log's tail already.
		if cerr := h.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("virttest: undo: %w", cerr))
		} else if tail != "" {
			err = fmt.Errorf("%w\nlast lines of %s:\n%s", err, h.LogPath, tail)
		}
		return nil, err
	}
	return h, nil
}

func (h *Host) launch(ctx context.Context) error {
	dir, err := os.MkdirTemp(h.opts.TempDir, "virttest-")
	if err != nil {
		return fmt.Errorf("virttest: temp dir: %w", err)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return fmt.Errorf("virttest: temp dir: %w", err)
	}
	h.Dir = dir
	h.LogPath = filepath.Join(dir, "libvirtd.log")

	// Sockets: sun_path holds 107 bytes, and t.TempDir paths carry the test's name.
	sockDir := filepath.Join(dir, "sock")
	if len(filepath.Join(sockDir, "libvirt-admin-sock")) > 100 {
		if sockDir, err = os.MkdirTemp("", "virttest-sock-"); err != nil {
			return fmt.Errorf("virttest: socket dir: %w", err)
		}
		h.sockDir = sockDir
	} else if err := os.Mkdir(sockDir, 0o700); err != nil {
		return fmt.Errorf("virttest: socket dir: %w", err)
	}
	h.Socket = filepath.Join(sockDir, "libvirt-sock")
	h.URI = "qemu:///system?socket=" + strings.ReplaceAll(url.QueryEscape(h.Socket), "%2F", "/")

	if h.script, err = h.prepare(sockDir); err != nil {
		return err
	}
	if !h.opts.HostNetwork {
		if err := h.addNamespace(); err != nil {
			return err
		}
	}
	return h.startDaemon(ctx)
}

// startDaemon starts libvirtd in the host's namespaces and waits until it answers.
func (h *Host) startDaemon(ctx context.Context) error {
	logFile, err := os.OpenFile(h.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("virttest: log: %w", err)
	}
	defer logFile.Close() // the child has its own copy
	// nsenter and unshare exec (they fork only for PID or time namespaces), and the script
	// ends by exec'ing libvirtd, so the child's PID is libvirtd's.
	args := []string{h.bins.unshare, "--mount", "--propagation", "private", "--", h.bins.sh, "-ec", h.script}
	if h.name != "" {
		args = append([]string{h.bins.nsenter, "--net=" + h.Namespace(), "--"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = h.Dir
	// If the test binary dies without running Close, take libvirtd down with it; its guests
	// and dnsmasq then lose their parent but stay in the namespace, where the next Close of
	// this process cannot see them — a crash is the one case that can leave something behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("virttest: start libvirtd: %w", err)
	}
	exited := make(chan struct{})
	h.cmd, h.exited, h.killed = cmd, exited, false
	go func() {
		h.waitErr = cmd.Wait()
		close(exited)
	}()

	if err := h.waitReady(ctx); err != nil {
		return err
	}
	h.ready = true
	// Only now is the child surely past unshare; a mount namespace equal to ours would mean
	// the sweep in Close matches every process of the machine, so it is refused.
	ino, err := nsInode(cmd.Process.Pid, "mnt")
	if err != nil {
		return fmt.Errorf("virttest: libvirtd's mount namespace: %w", err)
	}
	if self, _ := nsInode(os.Getpid(), "mnt"); ino == self {
		return errors.New("virttest: libvirtd shares the test's mount namespace")
	}
	h.mntIno = ino
	return nil
}

// StopDaemon stops libvirtd the way an operator's restart does (SIGTERM, SIGKILL after 10 s),
// and waits until it has exited. Its guests and dnsmasq keep running, as they do on a real
// host, and its clients lose their connection. StartDaemon starts it again.
func (h *Host) StopDaemon() error {
	if h.cmd == nil || h.hasExited() {
		return errors.New("virttest: libvirtd is not running")
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.exited:
	case <-time.After(10 * time.Second):
		h.kill()
		<-h.exited
	}
	return nil
}

// kill sends libvirtd SIGKILL, noting that its end is ours.
func (h *Host) kill() {
	h.killed = true
	_ = h.cmd.Process.Kill()
}

// Freeze stops libvirtd's process (SIGSTOP) without closing anything: its clients stay
// connected to a daemon that answers nothing, as to a host that hangs. Thaw (SIGCONT) lets it
// go on.
func (h *Host) Freeze() error { return h.signal(syscall.SIGSTOP) }

// Thaw lets a frozen libvirtd go on.
func (h *Host) Thaw() error { return h.signal(syscall.SIGCONT) }

func (h *Host) signal(sig syscall.Signal) error {
	if h.cmd == nil || h.hasExited() {
		return errors.New("virttest: libvirtd is not running")
	}
	return h.cmd.Process.Signal(sig)
}

// StartDaemon starts libvirtd again after StopDaemon, with the same state, configuration and
// socket, and waits until it answers; it finds the guests that kept running.
func (h *Host) StartDaemon(ctx context.Context) error {
	if !h.hasExited() {
		return errors.New("virttest: libvirtd is still running")
	}
	return h.startDaemon(ctx)
}

// waitReady polls libvirtd until a client can open qemu:///system and call it; polling is
// the only signal libvirtd gives that its drivers are initialised.
func (h *Host) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, h.opts.StartTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		select {
		case <-h.exited:
			return fmt.Errorf("virttest: libvirtd exited while starting: %v", h.waitErr)
		default:
		}
		if _, err := os.Stat(h.Socket); err == nil {
			if lastErr = h.ping(); lastErr == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			if lastErr == nil {
				lastErr = errors.New("socket never appeared")
			}
			return fmt.Errorf("virttest: libvirtd not ready within %v: %w (%v)", h.opts.StartTimeout, ctx.Err(), lastErr)
		case <-tick.C:
		}
	}
}

// pingLimit bounds one ping of a starting daemon.
const pingLimit = 2 * time.Second

// ping connects and asks libvirtd for its version, within pingLimit. A daemon that is starting
// accepts connections on its socket before it answers them, and go-libvirt's calls have no
// deadline (a read deadline would make its reader spin, taking the timeout for a temporary
// error): cutting the connection is what fails them.
func (h *Host) ping() error {
	l, done, err := h.connectWithin(pingLimit)
	if err != nil {
		return err
	}
	defer done()
	_, err = l.ConnectGetLibVersion()
	return err
}

// connectWithin connects for calls that must be over within limit: past it the connection is
// cut, which fails whatever call is waiting. done disconnects.
func (h *Host) connectWithin(limit time.Duration) (l *libvirt.Libvirt, done func(), err error) {
	d := h.dialer()
	watchdog := time.AfterFunc(limit, d.Cut)
	l = libvirt.NewWithDialer(d)
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		watchdog.Stop()
		return nil, nil, fmt.Errorf("virttest: connect to %s: %w", h.Socket, err)
	}
	return l, func() { watchdog.Stop(); _ = l.Disconnect() }, nil
}

// Connect returns a go-libvirt client connected to the host's qemu:///system. The caller
// disconnects it.
func (h *Host) Connect() (*libvirt.Libvirt, error) {
	l := libvirt.NewWithDialer(h.dialer())
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		return nil, fmt.Errorf("virttest: connect to %s: %w", h.Socket, err)
	}
	return l, nil
}

// dialer reaches the host's libvirtd socket.
func (h *Host) dialer() *dial.CutDialer {
	return &dial.CutDialer{Network: "unix", Address: h.Socket, Timeout: 5 * time.Second}
}

// Namespace returns the path of the host's network namespace, /var/run/netns/<name>, as
// nsenter --net= and setns take it.
func (h *Host) Namespace() string {
	if h.name == "" {
		return ""
	}
	return filepath.Join(netnsDir, h.name)
}

// DomainPID returns the host PID of the QEMU process of a running domain, from the pid file
// libvirt keeps under the private /run/libvirt/qemu.
func (h *Host) DomainPID(name string) (int, error) {
	return readPIDFile(filepath.Join(h.Dir, "run", "qemu", name+".pid"))
}

// LogTail returns the last Options.LogTailLines lines of libvirtd's log, or "" if there is
// none yet.
func (h *Host) LogTail() string {
	if h.LogPath == "" {
		return ""
	}
	b, err := os.ReadFile(h.LogPath)
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > h.opts.LogTailLines {
		lines = lines[len(lines)-h.opts.LogTailLines:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// Close destroys the domains and networks still running (through libvirt, so it cleans up
// after them), stops libvirtd, kills whatever is still in the host's namespaces, deletes the
// network namespace and removes the host's directories. It is safe to call more than once;
// later calls return the first result.
func (h *Host) Close() error {
	h.closeOnce.Do(func() { h.closeErr = h.close() })
	return h.closeErr
}

func (h *Host) close() error {
	deadline := time.Now().Add(h.opts.StopTimeout)
	var errs []error
	if h.cmd != nil && !h.hasExited() {
		_ = h.cmd.Process.Signal(syscall.SIGCONT) // a test that failed while it was frozen
		if h.ready {
			if err := h.destroyAll(time.Until(deadline)); err != nil {
				errs = append(errs, err)
			}
		}
		// SIGTERM lets libvirtd tear down what it made; SIGKILL if it does not go in time.
		_ = h.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-h.exited:
		case <-time.After(min(5*time.Second, time.Until(deadline))):
			h.kill()
		}
	}
	if h.netIno != 0 || h.mntIno != 0 {
		if err := h.sweep(deadline); err != nil {
			errs = append(errs, err)
		}
	}
	if h.cmd != nil {
		select {
		case <-h.exited:
		case <-time.After(max(time.Until(deadline), time.Second)):
			errs = append(errs, fmt.Errorf("virttest: libvirtd (pid %d) did not exit", h.cmd.Process.Pid))
		}
		// SIGTERM ends libvirtd with status 0: any other end is a crash (SIGSEGV, SIGABRT),
		// which would otherwise pass unseen if the test had nothing left to ask of it.
		if h.hasExited() && h.waitErr != nil && !h.killed {
			errs = append(errs, fmt.Errorf("virttest: libvirtd ended by itself: %w", h.waitErr))
		}
	}
	// The log goes with the directory; what it says of the failure goes with the error.
	if tail := h.LogTail(); len(errs) > 0 && tail != "" {
		errs = append(errs, fmt.Errorf("virttest: last lines of %s:\n%s", h.LogPath, tail))
	}
	if h.name != "" {
		if out, err := exec.Command(h.bins.ip, "netns", "del", h.name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("virttest: ip netns del %s: %v: %s", h.name, err, bytes.TrimSpace(out)))
		}
	}
	for _, d := range []string{h.sockDir, h.Dir} {
		if d == "" {
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, fmt.Errorf("virttest: remove %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

func (h *Host) hasExited() bool {
	select {
	case <-h.exited:
		return true
	default:
		return false
	}
}

// destroyAll stops every running domain and active network through libvirt, so libvirt kills
// QEMU and dnsmasq and removes taps, bridges and rules the way it normally does.
func (h *Host) destroyAll(limit time.Duration) error {
	if limit <= 0 {
		return errors.New("virttest: no time left to destroy domains")
	}
	// A daemon that stopped answering must not hold Close.
	l, done, err := h.connectWithin(limit)
	if err != nil {
		return err
	}
	defer done()
	var errs []error
	doms, _, err := l.ConnectListAllDomains(1, libvirt.ConnectListDomainsActive)
	if err != nil {
		errs = append(errs, fmt.Errorf("virttest: list domains: %w", err))
	}
	for _, d := range doms {
		if err := l.DomainDestroy(d); err != nil {
			errs = append(errs, fmt.Errorf("virttest: destroy domain %s: %w", d.Name, err))
		}
	}
	nets, _, err := l.ConnectListAllNetworks(1, libvirt.ConnectListNetworksActive)
	if err != nil {
		errs = append(errs, fmt.Errorf("virttest: list networks: %w", err))
	}
	for _, n := range nets {
		if err := l.NetworkDestroy(n); err != nil {
			errs = append(errs, fmt.Errorf("virttest: destroy network %s: %w", n.Name, err))
		}
	}
	return errors.Join(errs...)
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}

func randomUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func readPIDFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("virttest: pid file %s: bad content %q", path, b)
	}
	return pid, nil
}
