package server

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
)

// idlePoller holds the sockets waiting for their peer's next message, on one epoll instance
// of its own, so that an idle socket has no goroutine and no stack: its reader parks it and
// ends, and the poller starts a new reader once the socket has something to read (a frame,
// its end or an error). Go's runtime offers no readiness callback of its own poller, hence
// this one; the epoll instance is itself waited for through Go's poller, so the poller's
// goroutine holds no thread while nothing happens.
//
// A parked socket's descriptor must leave the epoll instance before it is closed (unpark,
// then close): a closed descriptor leaves by itself, and a new socket given the same number
// would otherwise be mistaken for it. Events carry a sequence number besides the descriptor
// for what is left of that race.
type idlePoller struct {
	ep   *os.File
	raw  syscall.RawConn
	epfd int
	done chan struct{}

	mu     sync.Mutex
	parked map[int32]parkedSocket // by descriptor
	seq    int32
	closed bool
}

type parkedSocket struct {
	c   *wsConn
	seq int32
}

// pollBatch is how many readiness events one wake-up of the poller takes.
const pollBatch = 128

func newIdlePoller() (*idlePoller, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("epoll: %w", err)
	}
	// Non-blocking, the file is registered with Go's poller, which reports it readable when
	// one of ours is.
	ep := os.NewFile(uintptr(fd), "epoll")
	raw, err := ep.SyscallConn()
	if err != nil {
		ep.Close()
		return nil, fmt.Errorf("epoll: %w", err)
	}
	p := &idlePoller{ep: ep, raw: raw, epfd: fd, done: make(chan struct{}), parked: map[int32]parkedSocket{}}
	go p.run()
	return p, nil
}

// run starts a reader for every socket that becomes ready, until close.
func (p *idlePoller) run() {
	defer close(p.done)
	events := make([]syscall.EpollEvent, pollBatch)
	for {
		var n int
		var werr error
		err := p.raw.Read(func(fd uintptr) bool {
			for {
				n, werr = syscall.EpollWait(int(fd), events, 0)
				if !errors.Is(werr, syscall.EINTR) {
					break
				}
			}
			return n > 0 || werr != nil // none ready: Go's poller waits for the next
		})
		if err != nil || werr != nil {
			return // closed
		}
		for _, c := range p.take(events[:n]) {
			go c.read()
		}
	}
}

// take removes the sockets the events name from the poller, and returns them.
func (p *idlePoller) take(events []syscall.EpollEvent) []*wsConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ready []*wsConn
	for _, ev := range events {
		if ps, ok := p.parked[ev.Fd]; ok && ps.seq == ev.Pad {
			p.removeLocked(ev.Fd)
			ready = append(ready, ps.c)
		}
	}
	return ready
}

func (p *idlePoller) removeLocked(fd int32) {
	delete(p.parked, fd)
	syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil)
}

// park hands the wait for the socket's next message to the poller: true means the poller
// starts the socket's next reader, and the caller, its reader, must end. False (no poller, the
// poller or the socket closing, or the kernel refusing) means the caller reads on. Only a
// reader whose frame reader holds no buffered byte may park: the socket alone then tells
// whether a frame is coming.
func (p *idlePoller) park(c *wsConn) bool {
	if p == nil || c.raw == nil {
		return false
	}
	parked := false
	err := c.raw.Control(func(fd uintptr) {
		p.mu.Lock()
		defer p.mu.Unlock()
		// c.closed is set before a closing socket is unparked: either this sees it, or the
		// unpark sees the socket parked.
		if p.closed || c.closed.Load() {
			return
		}
		p.seq++
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: int32(fd), Pad: p.seq}
		if syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev) != nil {
			return
		}
		p.parked[int32(fd)] = parkedSocket{c: c, seq: p.seq}
		c.parkedFd = int32(fd)
		parked = true
	})
	return err == nil && parked
}

// unpark starts a reader for the socket if it is parked: for a socket that is closing, whose
// reader must see the end through, and for one whose read deadline comes before the poller
// would notice it (the reader's read enforces it).
func (p *idlePoller) unpark(c *wsConn) {
	if p == nil {
		return
	}
	p.mu.Lock()
	ps, ok := p.parked[c.parkedFd]
	if !ok || ps.c != c {
		p.mu.Unlock()
		return
	}
	p.removeLocked(c.parkedFd)
	p.mu.Unlock()
	go c.read()
}

// parkedCount is how many sockets wait in the poller.
func (p *idlePoller) parkedCount() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.parked)
}

// close stops the poller: the sockets parked get readers of their own, and later parks are
// refused. It returns once the poller's goroutine has ended.
func (p *idlePoller) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	parked := p.parked
	p.parked = nil
	for fd := range parked {
		syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil)
	}
	p.mu.Unlock()
	for _, ps := range parked {
		go ps.c.read()
	}
	p.ep.Close() // ends run's wait
	<-p.done
}
