package libvirt

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/redistest"
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
		def := libvirtxml.Domain{Type: "qemu", Name: fmt.Sprintf("held-up-%d", i), Memory: &libvirtxml.DomainMemory{Value: 64, Unit: "MiB"},
			OS: &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}}}
		doc, err := def.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		dom, err := mine.DomainCreateXML(doc, 0)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := host.DomainPID(def.Name)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
		guests = append(guests, dom)
	}
	var waiting sync.WaitGroup
	for _, dom := range guests {
		waiting.Go(func() { _ = conn.DomainSuspend(dom) })
	}

	const (
		stuck   = "calls on the libvirt host's connection went unanswered while the host answers others; cutting the connection"
		stopped = "libvirt host stopped answering; cutting the connection"
	)
	eventually.Holds(t, 2*time.Minute, func() bool { return logs.has(stuck) || logs.has(stopped) },
		"the driver cuts its held-up connection; it logged %v", eventually.Lazy(logs.String))
	if !logs.has(stuck) {
		t.Fatalf("the heartbeat took calls held up by guests for the host not answering; logged %v", logs)
	}
	waiting.Wait()
	eventually.Holds(t, time.Minute, d.Connected, "the driver connected again")
	if _, err := d.host("test"); err != nil {
		t.Fatal(err)
	}
}

// messages is a slog handler that keeps the messages logged.
type messages struct {
	mu   sync.Mutex
	msgs []string
}

func (m *messages) Enabled(context.Context, slog.Level) bool { return true }
func (m *messages) WithAttrs([]slog.Attr) slog.Handler       { return m }
func (m *messages) WithGroup(string) slog.Handler            { return m }

func (m *messages) Handle(_ context.Context, r slog.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.msgs = append(m.msgs, r.Message)
	return nil
}

func (m *messages) has(msg string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Contains(m.msgs, msg)
}

func (m *messages) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.Join(m.msgs, "; ")
}
