package libvirt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/virttest"
)

// Calls on the driver's connection held up behind calls waiting on a guest that does not
// answer (its QEMU stopped) are not the host going away: the heartbeat, asking on a
// connection of its own, keeps the host connected. Only once a question on the driver's
// connection has gone unanswered for StuckTimeout is the connection cut, saying why, and
// dialled again.
func TestLibvirtHeartbeatOutlastsCallsHeldUp(t *testing.T) {
	host := virttest.Start(t, virttest.Options{})
	rs, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	logs := &messages{}
	d, conn := labDriverWith(t, labCatalogJSON(host, ""), rs.Addr, func(o *Options) {
		o.Logger, o.StuckTimeout = slog.New(logs), 30*time.Second
	})

	// More guests than libvirtd reads calls of one connection at once (5), made on a
	// connection of the test's, of no server's (the driver leaves them alone), their QEMU
	// stopped. Then a call on the driver's connection for each, which waits on the guest's
	// monitor and returns once the connection is cut.
	mine, err := host.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mine.Disconnect() })
	var guests []golibvirt.Domain
	for i := range 6 {
		guests = append(guests, stoppedGuest(t, host, mine, fmt.Sprintf("held-up-%d", i)))
	}
	var waiting sync.WaitGroup
	for _, dom := range guests {
		waiting.Go(func() { _ = conn.DomainSuspend(dom) })
	}

	const (
		stuck   = "calls on the libvirt host's connection went unanswered while the host answers others; cutting the connection"
		stopped = "libvirt host stopped answering; cutting the connection"
	)
	// Held up meanwhile: a placement passes the host by, at once, rather than wait behind them.
	eventually.Holds(t, 2*time.Minute, func() bool { return d.heldUp.Load() || logs.has(stopped) },
		"the driver sees its calls held up; it logged %v", eventually.Lazy(logs.String))
	tiny := &region.Flavor{ID: "tiny", CPUs: 1, MemoryGiB: 1, DiskGB: 1}
	if _, err := d.room(tiny); !errors.Is(err, region.ErrUnreachable) {
		t.Errorf("the room of a host whose calls are held up: %v, want ErrUnreachable", err)
	}
	eventually.Holds(t, 2*time.Minute, func() bool { return logs.has(stuck) || logs.has(stopped) },
		"the driver cuts its held-up connection; it logged %v", eventually.Lazy(logs.String))
	if !logs.has(stuck) {
		t.Fatalf("the heartbeat took calls held up by guests for the host not answering; logged %v", logs)
	}
	cut, _ := logs.find(stuck)
	var waited time.Duration
	cut.Attrs(func(a slog.Attr) bool {
		if a.Key == "unanswered_for" {
			waited = a.Value.Duration()
		}
		return true
	})
	if waited < 30*time.Second {
		t.Errorf("the connection was cut after %s unanswered, before its StuckTimeout of 30s", waited)
	}
	waiting.Wait()
	eventually.Holds(t, time.Minute, d.Connected, "the driver connected again")
	if _, err := d.room(tiny); errors.Is(err, region.ErrUnreachable) || d.heldUp.Load() {
		t.Errorf("the room of the host connected again: %v, held up %v; want it answered", err, d.heldUp.Load())
	}
}

// messages is a slog handler that keeps the records logged.
type messages struct {
	mu      sync.Mutex
	records []slog.Record
}

func (m *messages) Enabled(context.Context, slog.Level) bool { return true }
func (m *messages) WithAttrs([]slog.Attr) slog.Handler       { return m }
func (m *messages) WithGroup(string) slog.Handler            { return m }

func (m *messages) Handle(_ context.Context, r slog.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.records = append(m.records, r.Clone())
	return nil
}

func (m *messages) has(msg string) bool {
	_, found := m.find(msg)
	return found
}

// find returns the first record of the message.
func (m *messages) find(msg string) (slog.Record, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.records {
		if r.Message == msg {
			return r, true
		}
	}
	return slog.Record{}, false
}

func (m *messages) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	msgs := make([]string, len(m.records))
	for i, r := range m.records {
		msgs[i] = r.Message
	}
	return strings.Join(msgs, "; ")
}

// stoppedGuest starts a guest of no server's on conn (a connection of the test's: the driver
// leaves the guest alone) and stops its QEMU until the test ends, so that a call waiting on its
// monitor waits until then.
func stoppedGuest(t *testing.T, host *virttest.Host, conn *golibvirt.Libvirt, name string) golibvirt.Domain {
	t.Helper()
	def := libvirtxml.Domain{Type: "qemu", Name: name, Memory: &libvirtxml.DomainMemory{Value: 64, Unit: "MiB"},
		OS: &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}}}
	doc, err := def.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	dom, err := conn.DomainCreateXML(doc, 0)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := host.DomainPID(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	return dom
}
