// Package regiontest is the contract every region driver keeps, as a suite its tests run: Run
// makes servers through the driver's region.Client and checks what the interface's doc comments
// promise (states and their transitions, the tag index, the watch, the refusals), so a
// simulated region, a libvirt one and a router over several answer alike.
//
// The suite waits as a worker does: it watches the region and re-reads a server at each event
// the watch reports for it. It never sleeps for a state to come, so a driver whose watch misses
// a change fails instead of passing slowly.
package regiontest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/region"
)

// Capabilities say which optional parts of region.Client a driver offers. A part it does not
// offer must be refused with an error wrapping region.ErrRefused.
type Capabilities struct {
	// Snapshots: Snapshot starts an image of a server, which Images then lists and which
	// becomes READY.
	Snapshots bool
	// PublicIPs: a server can have a public IP address, from its create or from
	// UpdateNetworking.
	PublicIPs bool
	// NoConsole: the driver offers no interactive console, and refuses OpenConsole of any
	// server it has. It is the one part offered unless said otherwise, since every driver
	// before the OpenStack one had it.
	NoConsole bool
}

// Harness is a driver under test.
type Harness struct {
	// Client is the driver. Required.
	Client region.Client
	// Catalog is the driver's catalogue: it gives the spec's network its prefix and its project
	// an SSH certificate authority. Required.
	Catalog *region.Catalog
	// Spec returns a valid spec of a server named after name, in the driver's region: no SSH
	// certificate authority, no public IP, and the reserved tag region.InstanceTag set to a
	// value no other call returns. Its project must have an SSH certificate authority in
	// Catalog. Required.
	Spec func(name string) region.ServerSpec
	// Timeout is how long one step may take to settle (a server to build, stop, start, be
	// deleted; a watch to report): a real virtual machine under QEMU's software emulation may
	// need a minute or more. Defaults to 10s.
	Timeout time.Duration
	// Capabilities say what the driver offers beyond the servers' lifecycle.
	Capabilities Capabilities
	// ResizeFlavor is a flavor Spec's servers can be resized to: more CPUs or memory, and a
	// larger disk, so that resizing back is a shrink the driver must refuse. Required.
	ResizeFlavor string
}

// Run runs the contract against the harness's driver, as subtests of t.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Client == nil || h.Catalog == nil || h.Spec == nil || h.ResizeFlavor == "" {
		t.Fatal("regiontest: Client, Catalog, Spec and ResizeFlavor are required")
	}
	if h.Timeout == 0 {
		h.Timeout = 10 * time.Second
	}
	s := &suite{h: h, c: h.Client}
	s.w = startWatch(t, h.Client, h.Timeout)
	s.probe(t)

	t.Run("create, find and settle", s.createFindSettle)
	t.Run("stop and start", s.stopStart)
	t.Run("reboot", s.reboot)
	t.Run("resize", s.resize)
	t.Run("console output", s.consoleOutput)
	t.Run("update networking", s.updateNetworking)
	t.Run("ssh key", s.sshKey)
	t.Run("delete", s.delete)
	t.Run("unknown server", s.unknownServer)
	t.Run("console", s.console)
	t.Run("snapshots", s.snapshots)
	t.Run("public IPs", s.publicIPs)
	t.Run("watch resumes after its cursor", s.watchResumes)
	t.Run("watch ends with its callback's error", s.watchCallbackError)
}

type suite struct {
	h Harness
	c region.Client
	w *watch
	// unreported is set once the watch has not reported a server deleted by a cleanup.
	unreported atomic.Bool
}

// nudgeEvery is how often a change is made while waiting for a watch to report one, since
// a watch from "" starts from whenever it got going, which nothing outside it can see.
func (s *suite) nudgeEvery() time.Duration { return max(100*time.Millisecond, s.h.Timeout/50) }

// probe makes sure the shared watch is under way before any subtest relies on it: a server is
// changed until the watch reports it.
func (s *suite) probe(t *testing.T) {
	t.Helper()
	srv := s.create(t, s.h.Spec("contract-probe"))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.w.wait(srv.ID, s.h.Timeout, func(evs []region.Event) bool { return len(evs) > 0 })
	}()
	s.nudgeUntil(t, srv, done)
	if len(s.w.events(srv.ID)) == 0 {
		t.Fatalf("the watch reported nothing of server %s within %s: %v", srv.ID, s.h.Timeout, s.w.err())
	}
}

// nudgeUntil changes the server's networking (its allowed source addresses, back and forth)
// until done is closed, failing the test after the timeout.
func (s *suite) nudgeUntil(t *testing.T, srv region.Server, done <-chan struct{}) {
	t.Helper()
	deadline := time.NewTimer(s.h.Timeout)
	defer deadline.Stop()
	tick := time.NewTicker(s.nudgeEvery())
	defer tick.Stop()
	n := srv.Networking
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		case <-deadline.C:
			t.Fatalf("not within %s: a watch reporting changes of server %s", s.h.Timeout, srv.ID)
		case <-tick.C:
		}
		n.AllowedSourceAddresses = []string{[]string{"192.0.2.0/24", "198.51.100.0/24"}[i%2]}
		if _, err := s.c.UpdateNetworking(t.Context(), srv.ID, n); err != nil {
			t.Fatalf("UpdateNetworking %s to nudge the watch: %v", srv.ID, err)
		}
	}
}

// create makes a server of the spec, which must be accepted and come back as the spec asked,
// and deletes it when the test ends.
func (s *suite) create(t *testing.T, spec region.ServerSpec) region.Server {
	t.Helper()
	srv, err := s.c.CreateServer(t.Context(), spec)
	if err != nil {
		t.Fatalf("CreateServer %q: %v", spec.Name, err)
	}
	t.Cleanup(func() { s.remove(t, srv.ID) })
	if srv.ID == "" {
		t.Fatalf("CreateServer %q returned a server without an id", spec.Name)
	}
	checkSpec(t, "CreateServer", srv, spec)
	if !slices.Contains([]region.ServerState{region.ServerPending, region.ServerBuilding, region.ServerRunning}, srv.State) {
		t.Fatalf("CreateServer returned state %s, want PENDING, BUILDING or (built at once) RUNNING", srv.State)
	}
	return srv
}

// running makes a server of a fresh spec and waits until it runs.
func (s *suite) running(t *testing.T, name string) region.Server {
	t.Helper()
	return s.await(t, s.create(t, s.h.Spec(name)).ID, region.ServerRunning)
}

// remove deletes the server, unless it is gone already, and waits until the watch reports it
// deleted, so that a test leaves the region as it found it.
func (s *suite) remove(t *testing.T, id string) {
	t.Helper()
	if evs, _ := s.w.since(id); hasKind(evs, region.ServerDeleted) {
		return
	}
	if err := s.c.DeleteServer(context.Background(), id); err != nil {
		t.Errorf("clean up: DeleteServer %s: %v", id, err)
		return
	}
	if s.unreported.Load() {
		return // said once already; waiting out every cleanup would only slow the failure
	}
	if err := s.w.wait(id, s.h.Timeout, func(evs []region.Event) bool { return hasKind(evs, region.ServerDeleted) }); err != nil {
		s.unreported.Store(true)
		t.Errorf("clean up: server %s: %v", id, err)
	}
}

// await waits until GetServer shows the server in the state, re-reading it whenever the watch
// reports an event of it.
func (s *suite) await(t *testing.T, id string, want region.ServerState) region.Server {
	t.Helper()
	deadline := time.NewTimer(s.h.Timeout)
	defer deadline.Stop()
	var last region.Server
	for {
		_, next := s.w.since(id) // before the read, so no event after it is missed
		srv, err := s.c.GetServer(t.Context(), id)
		if err != nil {
			t.Fatalf("GetServer %s while waiting for %s: %v", id, want, err)
		}
		if srv.State == want {
			return srv
		}
		if srv.State == region.ServerError {
			t.Fatalf("server %s went to ERROR (%s) instead of %s", id, srv.Message, want)
		}
		last = srv
		select {
		case <-next:
		case <-s.w.done:
			t.Fatalf("the watch ended while waiting for server %s to be %s: %v", id, want, s.w.err())
		case <-deadline.C:
			t.Fatalf("not within %s: server %s %s (last seen %s, and the watch reported %d events of it)",
				s.h.Timeout, id, want, last.State, len(s.w.events(id)))
		}
	}
}

// transitional checks the state a verb returned: the transitional one, or the one it ends in
// for a driver whose action completes before it returns.
func transitional(t *testing.T, verb string, srv region.Server, states ...region.ServerState) {
	t.Helper()
	if !slices.Contains(states, srv.State) {
		t.Fatalf("%s returned state %s, want one of %v", verb, srv.State, states)
	}
}

// checkSpec fails unless the server carries the spec it was made with.
func checkSpec(t *testing.T, what string, srv region.Server, spec region.ServerSpec) {
	t.Helper()
	got, want := srv.ServerSpec, spec
	// The lists and user data may come back nil for empty, as they would through JSON.
	for _, sp := range []*region.ServerSpec{&got, &want} {
		if len(sp.UserData) == 0 {
			sp.UserData = nil
		}
		if len(sp.Networking.SecurityGroupIDs) == 0 {
			sp.Networking.SecurityGroupIDs = nil
		}
		if len(sp.Networking.AllowedSourceAddresses) == 0 {
			sp.Networking.AllowedSourceAddresses = nil
		}
	}
	if got.Scope != want.Scope || got.Name != want.Name || got.FlavorID != want.FlavorID || got.ImageID != want.ImageID ||
		got.SSHCertificateAuthorityID != want.SSHCertificateAuthorityID || string(got.UserData) != string(want.UserData) ||
		!slices.Equal(got.Networking.SecurityGroupIDs, want.Networking.SecurityGroupIDs) ||
		!slices.Equal(got.Networking.AllowedSourceAddresses, want.Networking.AllowedSourceAddresses) ||
		got.Networking.PublicIP != want.Networking.PublicIP || !maps.Equal(got.Tags, want.Tags) {
		t.Errorf("%s: server %s carries spec\n%+v\nwant\n%+v", what, srv.ID, got, want)
	}
}

func tagOf(t *testing.T, spec region.ServerSpec) string {
	t.Helper()
	v := spec.Tags[region.InstanceTag]
	if v == "" {
		t.Fatalf("Harness.Spec gave a spec without the tag %s", region.InstanceTag)
	}
	return v
}

func (s *suite) createFindSettle(t *testing.T) {
	spec := s.h.Spec("contract-find")
	value := tagOf(t, spec)
	created := s.create(t, spec)

	found, err := s.c.FindServers(t.Context(), spec.Scope, region.InstanceTag, value)
	if err != nil {
		t.Fatalf("FindServers: %v", err)
	}
	if len(found) != 1 || found[0].ID != created.ID {
		t.Fatalf("FindServers by its tag found %v, want just %s", ids(found), created.ID)
	}
	checkSpec(t, "FindServers", found[0], spec)

	otherScope := func(edit func(*region.Scope)) region.Scope { sc := spec.Scope; edit(&sc); return sc }
	for _, tc := range []struct {
		name  string
		scope region.Scope
		value string
	}{
		{"another value", spec.Scope, value + "-other"},
		{"another organization", otherScope(func(sc *region.Scope) { sc.OrganizationID += "-other" }), value},
		{"another project", otherScope(func(sc *region.Scope) { sc.ProjectID += "-other" }), value},
		{"another network", otherScope(func(sc *region.Scope) { sc.NetworkID += "-other" }), value},
	} {
		got, err := s.c.FindServers(t.Context(), tc.scope, region.InstanceTag, tc.value)
		if err != nil {
			t.Errorf("FindServers with %s: %v", tc.name, err)
		} else if len(got) != 0 {
			t.Errorf("FindServers with %s found %v, want none", tc.name, ids(got))
		}
	}

	got, err := s.c.GetServer(t.Context(), created.ID)
	if err != nil {
		t.Fatalf("GetServer: %v", err)
	}
	if got.ID != created.ID || !got.CreatedAt.Equal(created.CreatedAt) || got.CreatedAt.IsZero() {
		t.Errorf("GetServer returned id %s created at %v, want %s created at %v (not zero)", got.ID, got.CreatedAt, created.ID, created.CreatedAt)
	}
	checkSpec(t, "GetServer", got, spec)

	srv := s.await(t, created.ID, region.ServerRunning)
	s.checkAddresses(t, srv)
	// The watch reported it made, and every event of it says whose it is without a lookup.
	if err := s.w.wait(created.ID, s.h.Timeout, func(evs []region.Event) bool { return hasKind(evs, region.ServerCreated) }); err != nil {
		t.Errorf("server %s: %v", created.ID, err)
	}
	s.checkEvents(t, created.ID, spec)
}

// checkAddresses fails unless a running server has a MAC and a host address of its network.
func (s *suite) checkAddresses(t *testing.T, srv region.Server) {
	t.Helper()
	network, ok := s.h.Catalog.Network(srv.NetworkID)
	if !ok {
		t.Fatalf("the catalogue has no network %q", srv.NetworkID)
	}
	p := network.Prefix.Masked()
	ip, err := netip.ParseAddr(srv.PrivateIP)
	switch {
	case err != nil:
		t.Errorf("private IP %q: %v", srv.PrivateIP, err)
	case !p.Contains(ip):
		t.Errorf("private IP %s is not in the network's prefix %s", ip, p)
	case ip == p.Addr():
		t.Errorf("private IP %s is the network address of %s", ip, p)
	case !p.Contains(ip.Next()):
		t.Errorf("private IP %s is the broadcast address of %s", ip, p)
	}
	if mac, err := net.ParseMAC(srv.MAC); err != nil || len(mac) != 6 {
		t.Errorf("MAC %q is not a 48-bit MAC address (%v)", srv.MAC, err)
	}
}

// checkEvents fails unless every event the watch reported of the server carries its scope and
// its tag, and a cursor.
func (s *suite) checkEvents(t *testing.T, id string, spec region.ServerSpec) {
	t.Helper()
	for _, ev := range s.w.events(id) {
		if ev.Scope != spec.Scope || ev.Tags[region.InstanceTag] != spec.Tags[region.InstanceTag] || ev.Cursor == "" {
			t.Errorf("event %+v of server %s: want scope %+v, tag %s=%s and a cursor",
				ev, id, spec.Scope, region.InstanceTag, spec.Tags[region.InstanceTag])
		}
	}
}

func (s *suite) stopStart(t *testing.T) {
	id := s.running(t, "contract-power").ID

	srv, err := s.c.StopServer(t.Context(), id)
	if err != nil {
		t.Fatalf("StopServer: %v", err)
	}
	transitional(t, "StopServer", srv, region.ServerStopping, region.ServerStopped)
	s.await(t, id, region.ServerStopped)

	refused(t, "StopServer of a stopped server", func() error { _, err := s.c.StopServer(t.Context(), id); return err })
	refused(t, "RebootServer of a stopped server", func() error { _, err := s.c.RebootServer(t.Context(), id, false); return err })
	refused(t, "OpenConsole of a stopped server", func() error {
		c, err := s.c.OpenConsole(t.Context(), id)
		if err == nil {
			c.Close()
		}
		return err
	})
	if got, err := s.c.GetServer(t.Context(), id); err != nil || got.State != region.ServerStopped {
		t.Fatalf("after the refusals GetServer gives state %s (%v), want STOPPED", got.State, err)
	}

	if srv, err = s.c.StartServer(t.Context(), id); err != nil {
		t.Fatalf("StartServer: %v", err)
	}
	transitional(t, "StartServer", srv, region.ServerStarting, region.ServerRunning)
	s.await(t, id, region.ServerRunning)
	refused(t, "StartServer of a running server", func() error { _, err := s.c.StartServer(t.Context(), id); return err })
}

func (s *suite) reboot(t *testing.T) {
	before := s.running(t, "contract-reboot")
	for _, hard := range []bool{false, true} {
		srv, err := s.c.RebootServer(t.Context(), before.ID, hard)
		if err != nil {
			t.Fatalf("RebootServer (hard: %t): %v", hard, err)
		}
		transitional(t, fmt.Sprintf("RebootServer (hard: %t)", hard), srv, region.ServerRebooting, region.ServerRunning)
		after := s.await(t, before.ID, region.ServerRunning)
		if after.MAC != before.MAC || after.PrivateIP != before.PrivateIP {
			t.Errorf("reboot (hard: %t) changed MAC %s and private IP %s to %s and %s", hard, before.MAC, before.PrivateIP, after.MAC, after.PrivateIP)
		}
	}
}

// resize: a running server is refused; a stopped one takes the flavor and stays stopped,
// with its MAC and address; a flavor with a smaller disk is refused; started again, it runs
// with the new flavor.
func (s *suite) resize(t *testing.T) {
	before := s.running(t, "contract-resize")
	id, from := before.ID, before.FlavorID
	refused(t, "ResizeServer of a running server", func() error { _, err := s.c.ResizeServer(t.Context(), id, s.h.ResizeFlavor); return err })
	if _, err := s.c.StopServer(t.Context(), id); err != nil {
		t.Fatalf("StopServer: %v", err)
	}
	s.await(t, id, region.ServerStopped)
	srv, err := s.c.ResizeServer(t.Context(), id, s.h.ResizeFlavor)
	if err != nil {
		t.Fatalf("ResizeServer to %s: %v", s.h.ResizeFlavor, err)
	}
	if srv.ID != id || srv.FlavorID != s.h.ResizeFlavor || srv.State != region.ServerStopped {
		t.Errorf("ResizeServer returned %s with %s, %s; want %s with %s, STOPPED", srv.ID, srv.FlavorID, srv.State, id, s.h.ResizeFlavor)
	}
	if got := s.get(t, id); got.FlavorID != s.h.ResizeFlavor {
		t.Errorf("GetServer after the resize: flavor %s, want %s", got.FlavorID, s.h.ResizeFlavor)
	}
	refused(t, "ResizeServer back to a smaller disk", func() error { _, err := s.c.ResizeServer(t.Context(), id, from); return err })
	refused(t, "ResizeServer to a flavor that does not exist", func() error { _, err := s.c.ResizeServer(t.Context(), id, "no-such-flavor"); return err })
	if _, err := s.c.StartServer(t.Context(), id); err != nil {
		t.Fatalf("StartServer after the resize: %v", err)
	}
	after := s.await(t, id, region.ServerRunning)
	if after.FlavorID != s.h.ResizeFlavor || after.MAC != before.MAC || after.PrivateIP != before.PrivateIP {
		t.Errorf("after the resize: flavor %s, MAC %s, private IP %s; want %s, %s, %s", after.FlavorID, after.MAC, after.PrivateIP,
			s.h.ResizeFlavor, before.MAC, before.PrivateIP)
	}
}

// consoleOutput: a running server has written to its console; its tail is at most the bytes
// asked for and says it was cut; the text is valid UTF-8.
func (s *suite) consoleOutput(t *testing.T) {
	id := s.running(t, "contract-console-output").ID
	// A guest writes its boot log as it boots: RUNNING may come before its first line.
	var whole region.ConsoleOutput
	eventually.Holds(t, s.h.Timeout, func() bool {
		var err error
		if whole, err = s.c.ConsoleOutput(t.Context(), id, region.ConsoleOutputMax); err != nil {
			t.Fatalf("ConsoleOutput: %v", err)
		}
		return len(whole.Text) > 20
	}, "server %s writes to its console", id)
	if !utf8.ValidString(whole.Text) {
		t.Errorf("console output is not valid UTF-8: %q", whole.Text)
	}
	if whole.CapturedAt.IsZero() {
		t.Error("console output without the time it was captured")
	}
	tail, err := s.c.ConsoleOutput(t.Context(), id, 10)
	if err != nil {
		t.Fatalf("ConsoleOutput of 10 bytes: %v", err)
	}
	if len(tail.Text) > 10 || !tail.Truncated {
		t.Errorf("the last 10 bytes: %q, truncated %t; want at most 10 bytes, truncated", tail.Text, tail.Truncated)
	}
}

func (s *suite) updateNetworking(t *testing.T) {
	before := s.running(t, "contract-networking")
	n := before.Networking
	n.AllowedSourceAddresses = []string{"203.0.113.0/24"}
	if slices.Equal(before.Networking.AllowedSourceAddresses, n.AllowedSourceAddresses) {
		n.AllowedSourceAddresses = []string{"198.51.100.0/24"}
	}
	srv, err := s.c.UpdateNetworking(t.Context(), before.ID, n)
	if err != nil {
		t.Fatalf("UpdateNetworking: %v", err)
	}
	for _, got := range []region.Server{srv, s.get(t, before.ID)} {
		if got.ID != before.ID || got.MAC != before.MAC || got.PrivateIP != before.PrivateIP {
			t.Errorf("after UpdateNetworking: id %s, MAC %s, private IP %s; want them kept: %s, %s, %s",
				got.ID, got.MAC, got.PrivateIP, before.ID, before.MAC, before.PrivateIP)
		}
		if !slices.Equal(got.Networking.AllowedSourceAddresses, n.AllowedSourceAddresses) {
			t.Errorf("after UpdateNetworking the allowed source addresses are %v, want %v", got.Networking.AllowedSourceAddresses, n.AllowedSourceAddresses)
		}
	}
	// In place: the server runs on, it is not rebuilt.
	if got := s.get(t, before.ID); got.State != region.ServerRunning || !got.CreatedAt.Equal(before.CreatedAt) {
		t.Errorf("after UpdateNetworking the server is %s, created at %v; want RUNNING, created at %v", got.State, got.CreatedAt, before.CreatedAt)
	}
}

func (s *suite) get(t *testing.T, id string) region.Server {
	t.Helper()
	srv, err := s.c.GetServer(t.Context(), id)
	if err != nil {
		t.Fatalf("GetServer %s: %v", id, err)
	}
	return srv
}

// sshCA returns an SSH certificate authority of the spec's project.
func (s *suite) sshCA(t *testing.T, spec region.ServerSpec) string {
	t.Helper()
	for _, ca := range s.h.Catalog.SSHCertificateAuthorities {
		if ca.OrganizationID == spec.OrganizationID && ca.ProjectID == spec.ProjectID {
			return ca.ID
		}
	}
	t.Fatalf("the catalogue has no SSH certificate authority of project %s/%s, which the contract needs", spec.OrganizationID, spec.ProjectID)
	return ""
}

func (s *suite) sshKey(t *testing.T) {
	// The key is the project's: two servers of the project are given the same one.
	var keys []string
	for _, name := range []string{"contract-key-1", "contract-key-2"} {
		srv := s.create(t, s.h.Spec(name))
		key, err := s.c.SSHKey(t.Context(), srv.ID)
		if err != nil {
			t.Fatalf("SSHKey of a server without an SSH certificate authority: %v", err)
		}
		if _, err := ssh.ParsePrivateKey([]byte(key.PrivateKey)); err != nil {
			t.Fatalf("SSHKey returned a private key that does not parse: %v", err)
		}
		keys = append(keys, key.PrivateKey)
	}
	if keys[0] != keys[1] {
		t.Errorf("two servers of one project were given different keys")
	}

	spec := s.h.Spec("contract-key-ca")
	spec.SSHCertificateAuthorityID = s.sshCA(t, spec)
	srv := s.create(t, spec)
	refused(t, "SSHKey of a server with an SSH certificate authority", func() error { _, err := s.c.SSHKey(t.Context(), srv.ID); return err })
}

func (s *suite) delete(t *testing.T) {
	spec := s.h.Spec("contract-delete")
	id := s.running(t, "contract-delete-other").ID // a neighbour, which must survive
	srv := s.await(t, s.create(t, spec).ID, region.ServerRunning)

	if err := s.c.DeleteServer(t.Context(), srv.ID); err != nil {
		t.Fatalf("DeleteServer: %v", err)
	}
	if err := s.w.wait(srv.ID, s.h.Timeout, func(evs []region.Event) bool { return hasKind(evs, region.ServerDeleted) }); err != nil {
		t.Fatalf("server %s: %v", srv.ID, err)
	}
	s.checkEvents(t, srv.ID, spec)
	if _, err := s.c.GetServer(t.Context(), srv.ID); !errors.Is(err, region.ErrServerNotFound) {
		t.Errorf("GetServer of a deleted server: got %v, want ErrServerNotFound", err)
	}
	found, err := s.c.FindServers(t.Context(), spec.Scope, region.InstanceTag, tagOf(t, spec))
	if err != nil || len(found) != 0 {
		t.Errorf("FindServers after the delete: %v (%v), want none", ids(found), err)
	}
	if err := s.c.DeleteServer(t.Context(), srv.ID); err != nil {
		t.Errorf("DeleteServer of a deleted server: %v, want nil", err)
	}
	if got := s.get(t, id); got.State != region.ServerRunning {
		t.Errorf("the neighbour of the deleted server is %s, want RUNNING", got.State)
	}
}

func (s *suite) unknownServer(t *testing.T) {
	known := s.create(t, s.h.Spec("contract-known")).ID
	// A fresh id, and one shaped like a real one (whatever qualifies it kept) naming nothing.
	unknown := []string{uuid.NewString(), known[:strings.LastIndex(known, "/")+1] + uuid.NewString()}
	for _, id := range unknown {
		for _, tc := range []struct {
			verb string
			call func() error
			// skip: the verb is refused whatever the server, as an unsupported one is.
			skip bool
		}{
			{verb: "GetServer", call: func() error { _, err := s.c.GetServer(t.Context(), id); return err }},
			{verb: "StopServer", call: func() error { _, err := s.c.StopServer(t.Context(), id); return err }},
			{verb: "StartServer", call: func() error { _, err := s.c.StartServer(t.Context(), id); return err }},
			{verb: "RebootServer", call: func() error { _, err := s.c.RebootServer(t.Context(), id, true); return err }},
			{verb: "UpdateNetworking", call: func() error {
				_, err := s.c.UpdateNetworking(t.Context(), id, region.ServerNetworking{})
				return err
			}},
			{verb: "SSHKey", call: func() error { _, err := s.c.SSHKey(t.Context(), id); return err }},
			{verb: "ResizeServer", call: func() error { _, err := s.c.ResizeServer(t.Context(), id, s.h.ResizeFlavor); return err }},
			{verb: "ConsoleOutput", call: func() error { _, err := s.c.ConsoleOutput(t.Context(), id, 100); return err }},
			{verb: "OpenConsole", call: func() error { _, err := s.c.OpenConsole(t.Context(), id); return err }},
			{verb: "Snapshot", skip: !s.h.Capabilities.Snapshots, call: func() error {
				_, err := s.c.Snapshot(t.Context(), id, region.ImageRequest{Name: "x"})
				return err
			}},
		} {
			if tc.skip {
				continue
			}
			if err := tc.call(); !errors.Is(err, region.ErrServerNotFound) {
				t.Errorf("%s of unknown server %q: got %v, want ErrServerNotFound", tc.verb, id, err)
			}
		}
		if err := s.c.DeleteServer(t.Context(), id); err != nil {
			t.Errorf("DeleteServer of unknown server %q: %v, want nil", id, err)
		}
	}
	// Those calls changed nothing of the known server.
	if _, err := s.c.GetServer(t.Context(), known); err != nil {
		t.Errorf("GetServer %s: %v", known, err)
	}
}

// console types a line into a running server's console and reads it back, as a guest's
// terminal echoes it; a second attachment takes the console from the first, whose reads
// end; Close detaches.
func (s *suite) console(t *testing.T) {
	id := s.running(t, "contract-console").ID
	c, err := s.c.OpenConsole(t.Context(), id)
	if s.h.Capabilities.NoConsole {
		if err == nil {
			c.Close()
		}
		wantRefused(t, "OpenConsole of a running server in a driver without a console", err)
		return
	}
	if err != nil {
		t.Fatalf("OpenConsole: %v", err)
	}
	var (
		mu   sync.Mutex
		seen []byte
	)
	readDone := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			mu.Lock()
			seen = append(seen, buf[:n]...)
			mu.Unlock()
			if err != nil {
				readDone <- err
				return
			}
		}
	}()
	probe := "computeql-console-" + uuid.NewString()[:8]
	// Typed again while unseen (once a second): a guest still starting its terminal drops
	// what comes first.
	var typed time.Time
	eventually.Holds(t, s.h.Timeout, func() bool {
		mu.Lock()
		echoed := strings.Contains(string(seen), probe)
		mu.Unlock()
		if !echoed && time.Since(typed) > time.Second {
			typed = time.Now()
			if _, err := c.Write([]byte(probe + "\r")); err != nil {
				t.Fatalf("typing into the console: %v", err)
			}
		}
		return echoed
	}, "the console echoes %q", probe)
	// A second attachment takes the console: the first one's reads end.
	second, err := s.c.OpenConsole(t.Context(), id)
	if err != nil {
		t.Fatalf("a second OpenConsole: %v", err)
	}
	select {
	case <-readDone:
	case <-time.After(s.h.Timeout):
		t.Fatalf("the first attachment still reads %s after a second one took the console", s.h.Timeout)
	}
	for name, a := range map[string]io.ReadWriteCloser{"first": c, "second": second} {
		if err := a.Close(); err != nil {
			t.Errorf("Close of the %s attachment: %v", name, err)
		}
	}
	if _, err := second.Read(make([]byte, 1)); err == nil {
		t.Errorf("a read of the second attachment after its Close succeeded")
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Errorf("Write after Close succeeded")
	}
}

// snapshots: an image of a running server, which runs on; a server made from it; an image of
// a stopped server, which stays stopped; the image is its project's alone, and deleted.
func (s *suite) snapshots(t *testing.T) {
	srv := s.running(t, "contract-snapshot")
	req := region.ImageRequest{Name: "contract-snapshot-" + uuid.NewString()[:8], Tags: map[string]string{"made-by": "contract"}}
	img, err := s.c.Snapshot(t.Context(), srv.ID, req)
	if !s.h.Capabilities.Snapshots {
		wantRefused(t, "Snapshot of a driver without snapshots", err)
		return
	}
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if img.ID == "" || img.Name != req.Name || img.OrganizationID != srv.OrganizationID || img.ProjectID != srv.ProjectID ||
		!maps.Equal(img.Tags, req.Tags) || !slices.Contains(img.Regions, srv.RegionID) {
		t.Errorf("Snapshot returned %+v, want a new image named %q of project %s/%s in region %s with tags %v",
			img, req.Name, srv.OrganizationID, srv.ProjectID, srv.RegionID, req.Tags)
	}
	if img.State != region.ImageStateCreating && img.State != region.ImageStateReady {
		t.Errorf("Snapshot returned an image %s, want creating or (made at once) ready", img.State)
	}
	ready := s.awaitImage(t, srv, img.ID)
	// The shape of the server's image, the size of its disk.
	source, ok := s.h.Catalog.Image(srv.ImageID)
	flavor, fok := s.h.Catalog.Flavor(srv.FlavorID)
	if !ok || !fok {
		t.Fatalf("the catalogue has no image %q or flavor %q", srv.ImageID, srv.FlavorID)
	}
	if ready.Architecture != source.Architecture || ready.Virtualization != source.Virtualization || ready.SizeGiB != region.DiskGiB(flavor.DiskGB) {
		t.Errorf("the image is %s, %s, %d GiB; want its server's image's %s, %s and its disk's %d GiB", ready.Architecture, ready.Virtualization,
			ready.SizeGiB, source.Architecture, source.Virtualization, region.DiskGiB(flavor.DiskGB))
	}
	if got := s.get(t, srv.ID); got.State != region.ServerRunning || !got.CreatedAt.Equal(srv.CreatedAt) {
		t.Errorf("after the snapshot the server is %s, created at %v; want it RUNNING on, created at %v", got.State, got.CreatedAt, srv.CreatedAt)
	}
	// It is the project's: another project's list does not have it, nor can it delete it.
	images, err := s.c.Images(t.Context(), srv.OrganizationID, srv.ProjectID+"-other")
	if err != nil || slices.ContainsFunc(images, func(im region.Image) bool { return im.ID == img.ID }) {
		t.Errorf("another project's Images: %v (%v), want it without %s", images, err, img.ID)
	}
	if err := s.c.DeleteImage(t.Context(), srv.OrganizationID, srv.ProjectID+"-other", img.ID); !errors.Is(err, region.ErrImageNotFound) {
		t.Errorf("DeleteImage of another project's image: %v, want ErrImageNotFound", err)
	}

	// A server of the project boots from it.
	spec := s.h.Spec("contract-from-snapshot")
	spec.ImageID = img.ID
	from := s.await(t, s.create(t, spec).ID, region.ServerRunning)
	if from.ImageID != img.ID {
		t.Errorf("the server made from the snapshot has image %s, want %s", from.ImageID, img.ID)
	}
	s.remove(t, from.ID)

	// An image of a stopped server; it stays stopped.
	if _, err := s.c.StopServer(t.Context(), srv.ID); err != nil {
		t.Fatalf("StopServer: %v", err)
	}
	s.await(t, srv.ID, region.ServerStopped)
	stopped, err := s.c.Snapshot(t.Context(), srv.ID, region.ImageRequest{Name: req.Name + "-stopped"})
	if err != nil {
		t.Fatalf("Snapshot of a stopped server: %v", err)
	}
	s.awaitImage(t, srv, stopped.ID)
	if got := s.get(t, srv.ID); got.State != region.ServerStopped {
		t.Errorf("after the snapshot of the stopped server it is %s, want STOPPED", got.State)
	}

	for _, id := range []string{img.ID, stopped.ID} {
		if err := s.c.DeleteImage(t.Context(), srv.OrganizationID, srv.ProjectID, id); err != nil {
			t.Fatalf("DeleteImage %s: %v", id, err)
		}
		images, err := s.c.Images(t.Context(), srv.OrganizationID, srv.ProjectID)
		if err != nil || slices.ContainsFunc(images, func(im region.Image) bool { return im.ID == id }) {
			t.Errorf("Images after DeleteImage %s: %v (%v), want it gone", id, images, err)
		}
		if err := s.c.DeleteImage(t.Context(), srv.OrganizationID, srv.ProjectID, id); !errors.Is(err, region.ErrImageNotFound) {
			t.Errorf("DeleteImage of a deleted image: %v, want ErrImageNotFound", err)
		}
	}
	if err := s.c.DeleteImage(t.Context(), srv.OrganizationID, srv.ProjectID, uuid.NewString()); !errors.Is(err, region.ErrImageNotFound) {
		t.Errorf("DeleteImage of an unknown image: %v, want ErrImageNotFound", err)
	}
}

// awaitImage waits until Images lists the project's image READY, and returns it.
func (s *suite) awaitImage(t *testing.T, srv region.Server, id string) region.Image {
	t.Helper()
	var last region.Image
	eventually.Holds(t, s.h.Timeout, func() bool {
		images, err := s.c.Images(t.Context(), srv.OrganizationID, srv.ProjectID)
		if err != nil {
			t.Fatalf("Images: %v", err)
		}
		i := slices.IndexFunc(images, func(im region.Image) bool { return im.ID == id })
		if i < 0 {
			last.State = "(not listed)"
			return false
		}
		last = images[i]
		if last.State == region.ImageStateFailed {
			t.Fatalf("snapshot %s failed", id)
		}
		return last.State == region.ImageStateReady
	}, "Images lists snapshot %s ready (last seen %s)", id, eventually.Lazy(func() string { return string(last.State) }))
	return last
}

func (s *suite) publicIPs(t *testing.T) {
	spec := s.h.Spec("contract-public")
	spec.Networking.PublicIP = true
	if !s.h.Capabilities.PublicIPs {
		_, err := s.c.CreateServer(t.Context(), spec)
		wantRefused(t, "CreateServer with a public IP in a driver without public IPs", err)
		if found, err := s.c.FindServers(t.Context(), spec.Scope, region.InstanceTag, tagOf(t, spec)); err != nil || len(found) != 0 {
			t.Errorf("the refused create left %v behind (%v)", ids(found), err)
		}
		srv := s.create(t, s.h.Spec("contract-no-public"))
		n := srv.Networking
		n.PublicIP = true
		_, err = s.c.UpdateNetworking(t.Context(), srv.ID, n)
		wantRefused(t, "UpdateNetworking to a public IP in a driver without public IPs", err)
		if got := s.get(t, srv.ID); got.PublicIP != "" || got.Networking.PublicIP {
			t.Errorf("after the refusal the server has public IP %q (networking says %t)", got.PublicIP, got.Networking.PublicIP)
		}
		return
	}
	srv := s.await(t, s.create(t, spec).ID, region.ServerRunning)
	if _, err := netip.ParseAddr(srv.PublicIP); err != nil {
		t.Errorf("a running server made with a public IP has public IP %q (%v)", srv.PublicIP, err)
	}
	n := srv.Networking
	n.PublicIP = false
	if _, err := s.c.UpdateNetworking(t.Context(), srv.ID, n); err != nil {
		t.Fatalf("UpdateNetworking without the public IP: %v", err)
	}
	if got := s.get(t, srv.ID); got.PublicIP != "" {
		t.Errorf("after turning the public IP off the server has %q", got.PublicIP)
	}
	n.PublicIP = true
	if _, err := s.c.UpdateNetworking(t.Context(), srv.ID, n); err != nil {
		t.Fatalf("UpdateNetworking with a public IP: %v", err)
	}
	if got := s.get(t, srv.ID); got.PublicIP == "" {
		t.Errorf("after turning the public IP on the server has none")
	}
}

// watchResumes: a watch resumed at a cursor reports a server that changed after it (replaying
// the change, or reporting the server for its watcher to look at again).
func (s *suite) watchResumes(t *testing.T) {
	srv := s.running(t, "contract-resume")

	// A watch of its own, under way once it has reported a change of the server.
	ctx, cancel := context.WithCancel(t.Context())
	cursor := make(chan string, 1)
	ended := make(chan error, 1)
	go func() {
		ended <- s.c.Watch(ctx, "", func(ev region.Event) error {
			if ev.ServerID == srv.ID && ev.Cursor != "" {
				select {
				case cursor <- ev.Cursor:
				default:
				}
			}
			return nil
		})
	}()
	seen := make(chan struct{})
	var after string
	go func() {
		select {
		case after = <-cursor:
			close(seen)
		case <-ctx.Done():
		}
	}()
	s.nudgeUntil(t, srv, seen)
	cancel()
	if err := waitErr(ended, s.h.Timeout); err != nil {
		t.Fatalf("Watch after its context was cancelled: %v, want nil", err)
	}

	// Changed while nobody watches from that cursor.
	if _, err := s.c.StopServer(t.Context(), srv.ID); err != nil {
		t.Fatalf("StopServer: %v", err)
	}
	s.await(t, srv.ID, region.ServerStopped) // so a watch from now on would see nothing of it
	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	reported := make(chan struct{})
	go func() {
		ended <- s.c.Watch(ctx, after, func(ev region.Event) error {
			if ev.ServerID == srv.ID {
				cancel()
				close(reported)
				return context.Canceled
			}
			return nil
		})
	}()
	// The callback ends the watch once it has reported the server, so the watch's end says it.
	var err error
	select {
	case err = <-ended:
	case <-time.After(s.h.Timeout):
		t.Fatalf("not within %s: Watch from cursor %q reports server %s, stopped since", s.h.Timeout, after, srv.ID)
	}
	select {
	case <-reported:
	default:
		t.Fatalf("Watch from cursor %q ended with %v before it reported server %s", after, err, srv.ID)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Watch: %v", err)
	}
}

// watchCallbackError: the error fn returns ends the watch and is what Watch returns.
func (s *suite) watchCallbackError(t *testing.T) {
	srv := s.running(t, "contract-callback")
	errStop := errors.New("the watcher has had enough")
	ended := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ended <- s.c.Watch(t.Context(), "", func(ev region.Event) error {
			if ev.ServerID == srv.ID {
				return errStop
			}
			return nil
		})
	}()
	s.nudgeUntil(t, srv, done)
	if err := <-ended; !errors.Is(err, errStop) {
		t.Errorf("Watch whose callback failed returned %v, want the callback's error", err)
	}
}

func waitErr(ch <-chan error, limit time.Duration) error {
	select {
	case err := <-ch:
		return err
	case <-time.After(limit):
		return fmt.Errorf("did not return within %s", limit)
	}
}

func refused(t *testing.T, what string, call func() error) {
	t.Helper()
	wantRefused(t, what, call())
}

func wantRefused(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, region.ErrRefused) {
		t.Errorf("%s: got %v, want an error wrapping ErrRefused", what, err)
	}
}

func ids(servers []region.Server) []string {
	out := make([]string, len(servers))
	for i, s := range servers {
		out[i] = s.ID
	}
	return out
}

func hasKind(evs []region.Event, k region.EventKind) bool {
	return slices.ContainsFunc(evs, func(ev region.Event) bool { return ev.Kind == k })
}

// watch is the suite's one watch of the region: it keeps every event by server and wakes
// whoever waits on a server at its next event.
type watch struct {
	mu     sync.Mutex
	byID   map[string][]region.Event
	next   map[string]chan struct{} // closed at the server's next event
	ended  error
	done   chan struct{} // closed when the watch has returned
	cancel context.CancelFunc
}

// startWatch watches the client until the test ends; the watch must then return nil.
func startWatch(t *testing.T, c region.Client, limit time.Duration) *watch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watch{byID: map[string][]region.Event{}, next: map[string]chan struct{}{}, done: make(chan struct{}), cancel: cancel}
	go func() {
		err := c.Watch(ctx, "", w.record)
		w.mu.Lock()
		w.ended = err
		if w.ended == nil && ctx.Err() == nil {
			w.ended = errors.New("Watch returned nil before its context ended")
		}
		w.mu.Unlock()
		close(w.done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.done:
			if err := w.err(); err != nil {
				t.Errorf("Watch after its context was cancelled: %v, want nil", err)
			}
		case <-time.After(limit):
			t.Errorf("Watch did not return within %s of its context being cancelled", limit)
		}
	})
	return w
}

func (w *watch) record(ev region.Event) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.byID[ev.ServerID] = append(w.byID[ev.ServerID], ev)
	if ch, ok := w.next[ev.ServerID]; ok {
		close(ch)
		delete(w.next, ev.ServerID)
	}
	return nil
}

func (w *watch) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ended
}

// since returns the events of the server so far and a channel closed at its next one.
func (w *watch) since(id string) ([]region.Event, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch, ok := w.next[id]
	if !ok {
		ch = make(chan struct{})
		w.next[id] = ch
	}
	return slices.Clone(w.byID[id]), ch
}

func (w *watch) events(id string) []region.Event {
	evs, _ := w.since(id)
	return evs
}

// wait waits until the server's events satisfy cond.
func (w *watch) wait(id string, limit time.Duration, cond func([]region.Event) bool) error {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		evs, next := w.since(id)
		if cond(evs) {
			return nil
		}
		select {
		case <-next:
		case <-w.done:
			return fmt.Errorf("the watch ended (%v) before it reported what was awaited", w.err())
		case <-deadline.C:
			return fmt.Errorf("not within %s: the watch reported %d events of it, not what was awaited", limit, len(evs))
		}
	}
}
