package virttest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
)

// natNetworkXML is a libvirt NAT network with a DHCP range, written by hand (libvirtxml is not
// a dependency of this package).
const natNetworkXML = `<network>
  <name>t0</name>
  <forward mode='nat'/>
  <bridge name='virbr-t0' stp='on' delay='0'/>
  <domain name='virttest' localOnly='yes'/>
  <dns>
    <host ip='10.77.0.1'><hostname>gateway.virttest</hostname></host>
  </dns>
  <ip address='10.77.0.1' netmask='255.255.255.0'>
    <dhcp>
      <range start='10.77.0.100' end='10.77.0.200'/>
    </dhcp>
  </ip>
</network>`

// emptyDomainXML is a TCG guest with no disk and no kernel: the firmware finds nothing to boot
// and keeps trying, which is enough to prove QEMU runs in this setup. Its NIC proves libvirt
// can make a tap on the namespace's bridge.
const emptyDomainXML = `<domain type='qemu'>
  <name>%s</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <boot dev='network'/>
  </os>
  <devices>
    <interface type='network'>
      <source network='t0'/>
      <model type='virtio'/>
    </interface>
    <serial type='pty'/>
  </devices>
</domain>`

// serialDomainXML is a guest with no network whose serial port QEMU serves on a TCP port of
// 127.0.0.1 (%d).
const serialDomainXML = `<domain type='qemu'>
  <name>%s</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
  </os>
  <devices>
    <serial type='tcp'>
      <source mode='bind' host='127.0.0.1' service='%d'/>
      <protocol type='raw'/>
    </serial>
  </devices>
</domain>`

// launchClosedByTest launches a host for a test that checks its Close itself, and sets
// *closed before it does; the cleanup closes a host the test left open, after logging
// libvirtd's log.
func launchClosedByTest(t *testing.T, opts Options) (h *Host, closed *bool) {
	t.Helper()
	h, err := Launch(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	closed = new(bool)
	t.Cleanup(func() {
		if !*closed {
			t.Logf("libvirtd log:\n%s", h.LogTail())
			h.Close()
		}
	})
	return h, closed
}

func connect(t *testing.T, h *Host) *libvirt.Libvirt {
	t.Helper()
	l, err := h.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Disconnect() })
	return l
}

func startNATNetwork(t *testing.T, l *libvirt.Libvirt) {
	t.Helper()
	n, err := l.NetworkDefineXML(natNetworkXML)
	if err != nil {
		t.Fatalf("define network: %v", err)
	}
	if err := l.NetworkCreate(n); err != nil {
		t.Fatalf("start network: %v", err)
	}
}

// lookupGateway asks the DNS server at 10.77.0.1:53, over TCP connections made by dial, for
// the network's gateway.virttest. A real answer, not just an accepted connection, shows it is
// this network's dnsmasq: some sandboxes accept TCP connections to any address.
func lookupGateway(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error)) ([]net.IP, error) {
	r := &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx, "tcp", "10.77.0.1:53")
		},
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return r.LookupIP(ctx, "ip4", "gateway.virttest.")
}

// checkDNSInside resolves through dnsmasq from inside the namespace.
func checkDNSInside(t *testing.T, h *Host) {
	t.Helper()
	ips, err := lookupGateway(context.Background(), h.Dial)
	if err != nil {
		t.Fatalf("dnsmasq inside the namespace: %v", err)
	}
	if len(ips) != 1 || !ips[0].Equal(net.IPv4(10, 77, 0, 1)) {
		t.Fatalf("gateway.virttest = %v, want 10.77.0.1", ips)
	}
}

func TestNATNetworkStaysInNamespace(t *testing.T) {
	h := Start(t, Options{})
	l := connect(t, h)
	if !strings.HasPrefix(h.URI, "qemu:///system?socket=/") || !strings.HasSuffix(h.URI, h.Socket) {
		t.Errorf("URI = %q, want qemu:///system?socket=%s", h.URI, h.Socket)
	}
	startNATNetwork(t, l)
	ctx := context.Background()

	if out, err := h.Command(ctx, "ip", "link", "show", "virbr-t0").CombinedOutput(); err != nil {
		t.Errorf("bridge not in the namespace: %v: %s", err, out)
	}
	if out, err := exec.Command("ip", "link", "show", "virbr-t0").CombinedOutput(); err == nil {
		t.Errorf("bridge virbr-t0 exists on the machine: %s", out)
	}
	// libvirt's NAT rule is in the namespace's iptables, not the machine's.
	if out, err := h.Command(ctx, "iptables", "-w", "-t", "nat", "-S").CombinedOutput(); err != nil || !strings.Contains(string(out), "10.77.0.0/24") {
		t.Errorf("no NAT rule for 10.77.0.0/24 in the namespace (%v): %s", err, out)
	}
	if out, err := exec.Command("iptables", "-w", "-t", "nat", "-S").CombinedOutput(); err == nil && strings.Contains(string(out), "10.77.0.0/24") {
		t.Errorf("NAT rule for 10.77.0.0/24 on the machine: %s", out)
	}

	checkDNSInside(t, h)
	// From the machine's namespace (where Dial's thread is back, too) there is no dnsmasq at
	// 10.77.0.1: the dial fails, or whatever accepts it gives no answer.
	var d net.Dialer
	if ips, err := lookupGateway(ctx, d.DialContext); err == nil {
		t.Errorf("dnsmasq at 10.77.0.1 answered the machine's namespace: %v", ips)
	} else {
		t.Logf("from the machine's namespace, as expected: %v", err)
	}
	if _, err := h.Dial(ctx, "tcp", "localhost:53"); err == nil {
		t.Error("Dial accepted a host name")
	}
}

func TestBootDomainAndCloseLeavesNothing(t *testing.T) {
	Require(t)
	h, closed := launchClosedByTest(t, Options{TempDir: t.TempDir()})
	l := connect(t, h)
	startNATNetwork(t, l)

	dom, err := l.DomainDefineXML(fmt.Sprintf(emptyDomainXML, "vt-empty"))
	if err != nil {
		t.Fatalf("define domain: %v", err)
	}
	if err := l.DomainCreate(dom); err != nil {
		t.Fatalf("start domain: %v", err)
	}
	state, _, err := l.DomainGetState(dom, 0)
	if err != nil || libvirt.DomainState(state) != libvirt.DomainRunning {
		t.Fatalf("domain state = %d, %v; want running", state, err)
	}
	qemuPID, err := h.DomainPID("vt-empty")
	if err != nil {
		t.Fatal(err)
	}
	if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", qemuPID)); !strings.Contains(string(cmdline), "qemu-system") {
		t.Fatalf("pid %d is not QEMU: %q", qemuPID, cmdline)
	}
	if out, err := h.Command(context.Background(), "ip", "link", "show", "master", "virbr-t0").CombinedOutput(); err != nil || !strings.Contains(string(out), "vnet") {
		t.Errorf("no tap on the bridge (%v): %s", err, out)
	}
	procs := h.Processes()
	if len(procs) < 3 { // libvirtd, dnsmasq, QEMU
		t.Errorf("processes in the namespaces = %v, want at least libvirtd, dnsmasq and QEMU", procs)
	}
	// A process started with Command and left running is killed by Close too.
	sleeper := h.Command(context.Background(), "sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	sleepDone := make(chan error, 1)
	go func() { sleepDone <- sleeper.Wait() }()

	l.Disconnect()
	*closed = true
	if err := h.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	select {
	case <-sleepDone:
	case <-time.After(5 * time.Second):
		t.Error("process started with Command survived Close")
	}
	for _, pid := range append(procs, qemuPID) {
		waitGone(t, pid)
	}
	if left := h.Processes(); len(left) > 0 {
		t.Errorf("processes left in the namespaces: %v", left)
	}
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil || strings.Contains(string(out), filepath.Base(h.Namespace())) {
		t.Errorf("namespace %s still listed (%v): %s", h.Namespace(), err, out)
	}
	for _, d := range []string{h.Dir, filepath.Dir(h.Socket)} {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists (%v)", d, err)
		}
	}
	if _, err := h.Dial(context.Background(), "tcp", "10.77.0.1:53"); err == nil {
		t.Error("Dial works after Close")
	}
}

// waitGone waits until pid no longer exists. Killed daemons are orphans reaped by init, so
// this allows it a moment.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := syscall.Kill(pid, 0)
		if errors.Is(err, syscall.ESRCH) {
			return
		}
		if time.Now().After(deadline) {
			status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			t.Errorf("pid %d still exists after Close: %.200s", pid, status)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestTwoHostsDoNotInterfere(t *testing.T) {
	var hosts [2]*Host
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	Require(t)
	for i := range hosts {
		wg.Go(func() {
			h, err := Launch(context.Background(), Options{TempDir: t.TempDir()})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			hosts[i] = h
		})
	}
	wg.Wait()
	for _, h := range hosts {
		if h != nil {
			t.Cleanup(func() {
				if err := h.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
			})
		}
	}
	if len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	a, b := hosts[0], hosts[1]
	if a.Namespace() == b.Namespace() || a.Socket == b.Socket || a.Dir == b.Dir {
		t.Fatalf("hosts share a namespace, socket or directory: %+v %+v", a, b)
	}
	// The same network (name, bridge, subnet) in both: each in its own namespace.
	la, lb := connect(t, a), connect(t, b)
	startNATNetwork(t, la)
	startNATNetwork(t, lb)
	checkDNSInside(t, a)
	checkDNSInside(t, b)

	if _, err := la.DomainDefineXML(fmt.Sprintf(emptyDomainXML, "only-in-a")); err != nil {
		t.Fatal(err)
	}
	if _, err := lb.DomainLookupByName("only-in-a"); err == nil {
		t.Error("a domain defined on host a is visible on host b")
	}

	// Neither daemon's mount namespace pins the other's network namespace.
	for _, h := range hosts {
		mountinfo, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", h.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(mountinfo), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], "/run/netns") {
				t.Errorf("libvirtd's mount namespace still has %s mounted", f[4])
			}
		}
	}

	// Closing one leaves the other working.
	if err := a.Close(); err != nil {
		t.Fatalf("close a: %v", err)
	}
	if _, err := lb.ConnectGetLibVersion(); err != nil {
		t.Errorf("host b after closing a: %v", err)
	}
	checkDNSInside(t, b)
}

// A libvirt directory the machine does not have is made inside an overlay of its parent, in
// the mount namespace only.
func TestMissingStateDirIsMadePrivately(t *testing.T) {
	Require(t)
	absent := "/var/lib/virttest-absent-" + randomHex(4)
	saved := stateDirs
	stateDirs = append(slices.Clone(saved), [2]string{"absent", absent})
	h := Start(t, Options{})
	stateDirs = saved

	root := fmt.Sprintf("/proc/%d/root", h.cmd.Process.Pid) // libvirtd's view of the filesystem
	if err := os.WriteFile(filepath.Join(h.Dir, "absent", "probe"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root + absent + "/probe"); err != nil {
		t.Errorf("libvirtd does not see %s bound to the host's directory: %v", absent, err)
	}
	if _, err := os.Stat(absent); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s was made on the machine (%v)", absent, err)
	}
	// The rest of /var/lib is still there for libvirtd.
	entries, err := os.ReadDir("/var/lib")
	if err != nil || len(entries) == 0 {
		t.Fatalf("read /var/lib: %v", err)
	}
	if _, err := os.Stat(root + "/var/lib/" + entries[0].Name()); err != nil {
		t.Errorf("the overlay hides /var/lib/%s: %v", entries[0].Name(), err)
	}
}

// TestHostNetworkSharesOnlyTheNetwork: with HostNetwork, libvirtd and its guests are in the
// machine's network namespace (QEMU's serial port is one of the machine's) but a private mount
// namespace;
// Processes lists libvirtd and QEMU and nothing else of the machine, so that Close, which kills
// what it lists, leaves the machine's processes alone and the guests gone.
func TestHostNetworkSharesOnlyTheNetwork(t *testing.T) {
	Require(t)
	h, closed := launchClosedByTest(t, Options{TempDir: t.TempDir(), HostNetwork: true})
	if h.Namespace() != "" {
		t.Errorf("Namespace() = %q, want none", h.Namespace())
	}
	port, err := freeTCPPort()
	if err != nil {
		t.Fatal(err)
	}
	l := connect(t, h)
	dom, err := l.DomainDefineXML(fmt.Sprintf(serialDomainXML, "vt-hostnet", port))
	if err != nil {
		t.Fatalf("define domain: %v", err)
	}
	if err := l.DomainCreate(dom); err != nil {
		t.Fatalf("start domain: %v", err)
	}
	qemuPID, err := h.DomainPID("vt-hostnet")
	if err != nil {
		t.Fatal(err)
	}
	self, err := nsInode(os.Getpid(), "net")
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{h.cmd.Process.Pid, qemuPID} {
		if ino, err := nsInode(pid, "net"); err != nil || ino != self {
			t.Errorf("pid %d is in network namespace %d (%v), want the machine's %d", pid, ino, err, self)
		}
	}
	// QEMU's serial port is a port of the machine's: the test, outside, reaches it.
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second)
	if err != nil {
		t.Errorf("QEMU's serial port 127.0.0.1:%d from the machine's namespace: %v", port, err)
	} else {
		conn.Close()
	}
	procs := h.Processes()
	if !slices.Contains(procs, h.cmd.Process.Pid) || !slices.Contains(procs, qemuPID) {
		t.Errorf("Processes() = %v, want libvirtd %d and QEMU %d among them", procs, h.cmd.Process.Pid, qemuPID)
	}
	mine, err := nsInode(os.Getpid(), "mnt")
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range procs {
		if ino, err := nsInode(pid, "mnt"); err == nil && ino == mine {
			t.Errorf("Processes() lists pid %d, a process of the machine's mount namespace", pid)
		}
	}
	l.Disconnect()
	*closed = true
	if err := h.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	waitGone(t, qemuPID)
	if err := syscall.Kill(os.Getppid(), 0); err != nil {
		t.Errorf("the test's parent process is gone after Close: %v", err)
	}
}

// A libvirtd that ends by itself (here SIGABRT, as its own abort() would) fails Close with its
// exit status and the tail of its log, even when the test had nothing left to ask of it; one
// the test stopped with StopDaemon, or that SIGTERM ended, does not.
func TestCloseReportsADaemonThatCrashed(t *testing.T) {
	Require(t)
	for _, tc := range []struct {
		name    string
		end     func(h *Host) error
		crashed bool
	}{
		{"aborted", func(h *Host) error { return h.signal(syscall.SIGABRT) }, true},
		{"stopped by the test", (*Host).StopDaemon, false},
		{"left running", func(*Host) error { return nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, closed := launchClosedByTest(t, Options{})
			exited := h.exited
			if err := tc.end(h); err != nil {
				t.Fatal(err)
			}
			if tc.crashed {
				<-exited // the crash is over before Close begins
			}
			*closed = true
			err := h.Close()
			if !tc.crashed {
				if err != nil {
					t.Fatalf("close: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("close of a libvirtd that aborted: no error")
			}
			for _, want := range []string{"libvirtd ended by itself: signal: aborted", "last lines of " + h.LogPath} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("close: %v\nwant it to say %q", err, want)
				}
			}
		})
	}
}
