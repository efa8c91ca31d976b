package chaos

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from a loopback port to a target, and cuts them when the test
// says: the network between the processes of a deployment and Redis, with blips the test
// controls. It has two ways to fail, as networks do:
//
//   - Reset closes every connection at once and refuses new ones (accepted and closed at
//     once) until Restore: what a restarted middlebox or a flushed NAT table does. Clients
//     see errors straight away.
//   - Stall stops passing bytes either way, on every connection old and new, until Restore,
//     when what was held flows again: a congested or partitioned link. Clients see nothing
//     but silence, and only their own timeouts end their waits.
//
// It is closed when the test ends, with every connection and goroutine it started.
type Proxy struct {
	// Addr is the loopback host:port to connect to instead of the target.
	Addr   string
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	links  map[*link]struct{}
	reset  bool          // refusing: between Reset and Restore
	gate   chan struct{} // closed while bytes may pass; open (blocking) while stalled
	closed bool
}

// link is one proxied connection: the client's side and the target's.
type link struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{} // closed when the link is closed
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.done)
		l.client.Close()
		l.server.Close()
	})
}

// StartProxy listens on a free loopback port and forwards to target.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, links: map[*link]struct{}{}, gate: open}
	p.wg.Go(p.accept)
	tb.Cleanup(p.Close)
	return p
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		refuse := p.reset || p.closed
		p.mu.Unlock()
		if refuse {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, server: s, done: make(chan struct{})}
		p.mu.Lock()
		if p.reset || p.closed {
			p.mu.Unlock()
			l.close()
			continue
		}
		p.links[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(l, l.server, l.client) })
		p.wg.Go(func() { p.pipe(l, l.client, l.server) })
	}
}

// pipe copies src to dst until either side ends, holding each chunk while the proxy stalls.
func (p *Proxy) pipe(l *link, dst, src net.Conn) {
	defer p.forget(l)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			select {
			case <-gate:
			case <-l.done:
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // the other side ended, or the link was closed
		}
	}
}

func (p *Proxy) forget(l *link) {
	l.close()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// Reset closes every connection and refuses new ones until Restore. It returns how many
// connections it closed.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	p.reset = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
	return len(links)
}

// Stall holds every byte in both directions, on every connection, until Restore. It returns
// how many connections it stalled (new ones stall too).
func (p *Proxy) Stall() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // stalled already
	}
	return len(p.links)
}

// Restore lets connections through again: new ones are accepted, held bytes flow.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reset = false
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// Close stops listening, closes every connection and waits for the proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	p.ln.Close()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
}
