package virttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// netnsDir is where ip netns keeps its named namespaces.
const netnsDir = "/var/run/netns"

// binaries are the absolute paths of the programs the harness runs.
type binaries struct {
	libvirtd, qemu, dnsmasq, ip, nsenter, unshare, sh, iptables, ip6tables string
}

// lookPath finds a program on PATH, then in the sbin directories, which a test runner's PATH
// often lacks even when it runs as root.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

func lookBinaries() (binaries, error) {
	var b binaries
	var missing []string
	for _, x := range []struct {
		name string
		dst  *string
		pkg  string
	}{
		{"libvirtd", &b.libvirtd, "libvirt-daemon libvirt-daemon-driver-qemu"},
		{"qemu-system-x86_64", &b.qemu, "qemu-system-x86"},
		{"dnsmasq", &b.dnsmasq, "dnsmasq-base"},
		{"ip", &b.ip, "iproute2"},
		{"nsenter", &b.nsenter, "util-linux"},
		{"unshare", &b.unshare, "util-linux"},
		{"sh", &b.sh, "dash"},
		// libvirt 9's network driver runs iptables and ip6tables itself for NAT networks.
		{"iptables", &b.iptables, "iptables"},
		{"ip6tables", &b.ip6tables, "iptables"},
	} {
		p, err := lookPath(x.name)
		if err != nil {
			missing = append(missing, fmt.Sprintf("%s (apt-get install %s)", x.name, x.pkg))
			continue
		}
		*x.dst = p
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("missing %s", strings.Join(missing, ", "))
	}
	return b, nil
}

// Available reports whether a Host can be started here: nil when the programs it runs exist
// and the process is root (namespaces, mounts and libvirt's system daemon need it); otherwise
// an error naming everything that is missing.
func Available() error {
	var problems []string
	if runtime.GOOS != "linux" {
		problems = append(problems, "not Linux")
	}
	if os.Geteuid() != 0 {
		problems = append(problems, fmt.Sprintf("not root (euid %d)", os.Geteuid()))
	}
	if _, err := lookBinaries(); err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		return fmt.Errorf("virttest: cannot run a private libvirtd: %s", strings.Join(problems, "; "))
	}
	return nil
}

// addNamespace creates the host's network namespace with lo up.
func (h *Host) addNamespace() error {
	name := "computeql-" + randomHex(4)
	if out, err := exec.Command(h.bins.ip, "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("virttest: ip netns add %s: %v: %s", name, err, bytes.TrimSpace(out))
	}
	h.name = name // from here on Close deletes it
	var st unix.Stat_t
	if err := unix.Stat(h.Namespace(), &st); err != nil {
		return fmt.Errorf("virttest: stat %s: %w", h.Namespace(), err)
	}
	// The sweep in Close kills everything in this namespace: make sure it is not ours.
	if self, err := nsInode(os.Getpid(), "net"); err != nil || self == st.Ino {
		return fmt.Errorf("virttest: new namespace %s is indistinguishable from the test's (%v)", name, err)
	}
	h.netIno = st.Ino
	if out, err := exec.Command(h.bins.ip, "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("virttest: lo up in %s: %v: %s", name, err, bytes.TrimSpace(out))
	}
	return nil
}

// nsInode returns the inode of a process's namespace of the given kind ("net", "mnt").
func nsInode(pid int, kind string) (uint64, error) {
	link, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", kind))
	if err != nil {
		return 0, err
	}
	// kind:[inode]
	i, j := strings.IndexByte(link, '['), strings.IndexByte(link, ']')
	if i < 0 || j < i {
		return 0, fmt.Errorf("unexpected namespace link %q", link)
	}
	return strconv.ParseUint(link[i+1:j], 10, 64)
}

// Processes returns the PIDs of the processes in the host's network namespace or in
// libvirtd's mount namespace: libvirtd, dnsmasq, QEMU and whatever Command started and is
// still running. Namespaces are matched by inode, so it keeps working after Close deleted the
// namespace's name; after Close it should be empty. Zombies, which have left their
// namespaces, are not listed.
func (h *Host) Processes() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid() // a thread of ours may be inside the namespace for Dial
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if ino, err := nsInode(pid, "net"); err == nil && ino == h.netIno && h.netIno != 0 {
			pids = append(pids, pid)
			continue
		}
		if ino, err := nsInode(pid, "mnt"); err == nil && ino == h.mntIno && h.mntIno != 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// pidFilePIDs returns the PIDs libvirt recorded for QEMU and dnsmasq under the private
// /run/libvirt.
func (h *Host) pidFilePIDs() []int {
	var pids []int
	for _, pattern := range []string{"run/qemu/*.pid", "run/network/*.pid"} {
		files, _ := filepath.Glob(filepath.Join(h.Dir, pattern))
		for _, f := range files {
			if pid, err := readPIDFile(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// sweep kills, by PID, every process still in the host's namespaces, and waits until there
// are none. PIDs from libvirt's pid files are only killed when they are still in the
// namespace, so a PID reused by an unrelated process since is left alone.
func (h *Host) sweep(deadline time.Time) error {
	for {
		pids := h.Processes()
		for _, pid := range h.pidFilePIDs() {
			if ino, err := nsInode(pid, "net"); err == nil && ino == h.netIno && !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("virttest: processes still in namespace %s: %v", h.name, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Command returns a command that runs name with args inside the host's network namespace
// (through nsenter --net, which execs it, so the command's process is the program's). The
// filesystem is the test's, not libvirtd's private view.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	if h.name == "" {
		return exec.CommandContext(ctx, name, args...)
	}
	return exec.CommandContext(ctx, h.bins.nsenter, append([]string{"--net=" + h.Namespace(), "--", name}, args...)...)
}

// Dial connects to addr from inside the host's network namespace, like net.Dialer.DialContext;
// the connection keeps the namespace of the socket it was made with, so it can be used from
// any goroutine. network is tcp, tcp4, tcp6, udp, udp4 or udp6, and addr's host must be an IP
// address: a name would be resolved by goroutines that are not in the namespace.
func (h *Host) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6", "udp", "udp4", "udp6":
	default:
		return nil, fmt.Errorf("virttest: dial: network %q is not supported", network)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("virttest: dial: %w", err)
	}
	if net.ParseIP(host) == nil {
		return nil, fmt.Errorf("virttest: dial: %q is not an IP address", host)
	}
	if h.name == "" {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	// A goroutine of its own: if it cannot return its thread to the original namespace, it
	// exits still locked, and the Go runtime then ends the thread instead of reusing it.
	go func() {
		runtime.LockOSThread()
		conn, restored, err := h.dialInside(ctx, network, addr)
		if restored {
			runtime.UnlockOSThread()
		}
		done <- result{conn, err}
	}()
	r := <-done
	return r.conn, r.err
}

// dialInside runs on a locked thread: it enters the namespace, creates and connects the
// socket there, and switches back. restored reports whether the thread is back in its
// original namespace.
func (h *Host) dialInside(ctx context.Context, network, addr string) (conn net.Conn, restored bool, err error) {
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, true, fmt.Errorf("virttest: dial: current namespace: %w", err)
	}
	defer unix.Close(orig)
	target, err := unix.Open(h.Namespace(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, true, fmt.Errorf("virttest: dial: namespace: %w", err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("virttest: dial: setns %s: %w", h.Namespace(), err)
	}
	var d net.Dialer
	conn, err = d.DialContext(ctx, network, addr)
	if rerr := unix.Setns(orig, unix.CLONE_NEWNET); rerr != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, false, errors.Join(err, fmt.Errorf("virttest: dial: return to the original namespace: %w", rerr))
	}
	return conn, true, err
}
