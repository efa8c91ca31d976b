package libvirt

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/libvirt/dial"
)

// A libvirt stream (a console's output, a download of the console log) runs on a connection
// of its own, never the host's shared one, and so does a snapshot's disk copy, which takes as
// long as the disk takes to copy: on the shared connection it would hold one of the five calls
// libvirtd reads of a connection at once, and five copies would hold up every other call.
//
// go-libvirt can wedge a connection at the end of a stream: should a packet of the stream
// arrive after the call has forgotten its serial (the empty packet that ends a download, then
// libvirt's next; a console's output still coming as it is closed), the connection's reader
// waits for ever to hand it over, and with it every later call on that connection. A CI run of
// the Debian guest's console output hung so, and took the host's whole session with it. On a
// connection of its own only the stream waits: its caller cuts the connection and leaves the
// call behind, its goroutines with it, counted until it returns.

// streams bounds a host's streams of one kind: those running, and those left behind whose call
// has not returned. Past either bound a new stream is refused as unavailable, before it dials;
// a disk copy, which nobody waits for, waits for a running one to end instead (awaitStream).
type streams struct {
	what         string
	running      chan struct{}
	abandoned    atomic.Int64
	maxAbandoned int64
}

func newStreams(what string, running, abandoned int) *streams {
	return &streams{what: what, running: make(chan struct{}, running), maxAbandoned: int64(abandoned)}
}

// A stream's fate, settled once: its call returned, or its caller left it behind first.
const (
	streaming int32 = iota
	streamReturned
	streamAbandoned
)

// stream is one call on a connection of its own, holding one of its kind's slots until its
// call returns or its caller leaves it.
type stream struct {
	conn *golibvirt.Libvirt
	cut  *dial.CutDialer
	of   *streams
	fate atomic.Int32
	slot sync.Once
}

// openStream takes a slot of the kind, refusing when none is free, and connects to the host.
func (d *hostDriver) openStream(of *streams) (*stream, error) {
	select {
	case of.running <- struct{}{}:
	default:
		return nil, fmt.Errorf("%d %s are under way on the host: %w", cap(of.running), of.what, region.ErrUnavailable)
	}
	return d.dialStream(context.Background(), of)
}

// awaitStream is openStream waiting for a free slot of the kind, until ctx ends; the dial,
// too, is cut when ctx ends.
func (d *hostDriver) awaitStream(ctx context.Context, of *streams) (*stream, error) {
	select {
	case of.running <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// A slot freed as ctx ended (a session's end cuts the copies under way) may have won
	// the select: the host is going away, so dial no more.
	if err := ctx.Err(); err != nil {
		<-of.running
		return nil, err
	}
	return d.dialStream(ctx, of)
}

// dialStream connects to the host for a stream of the kind whose slot the caller took, giving
// up when ctx ends.
func (d *hostDriver) dialStream(ctx context.Context, of *streams) (*stream, error) {
	if n := of.abandoned.Load(); n >= of.maxAbandoned {
		<-of.running
		return nil, fmt.Errorf("%d %s are stuck on the host's connections: %w", n, of.what, region.ErrUnavailable)
	}
	cut := d.dialer()
	conn := golibvirt.NewWithDialer(cut)
	watchdog := time.AfterFunc(d.opts.ConnectTimeout, cut.Cut) // as session's: calls carry no deadline
	ended := context.AfterFunc(ctx, cut.Cut)
	err := conn.ConnectToURI(golibvirt.ConnectURI(d.uri.Name))
	watchdog.Stop()
	ended()
	if err != nil {
		cut.Cut()
		<-of.running
		return nil, fmt.Errorf("connect for %s: %w", of.what, err)
	}
	return &stream{conn: conn, cut: cut, of: of}, nil
}

// returned ends a stream whose call returned (with err): a stream left behind stops being
// counted; one that went well says goodbye to the host first, for a heartbeat at most (a host
// that stopped answering would hold the goodbye for ever; the cut fails it).
func (s *stream) returned(err error) {
	if !s.fate.CompareAndSwap(streaming, streamReturned) {
		s.of.abandoned.Add(-1)
	}
	s.release()
	if err == nil {
		bye := time.AfterFunc(heartbeat, s.cut.Cut)
		_ = s.conn.Disconnect()
		bye.Stop()
	}
	s.cut.Cut()
}

// abandon leaves the stream's call behind: the connection is cut, and the call is counted
// until it returns (it may never, if go-libvirt wedged it). Its slot is given back at once.
func (s *stream) abandon() {
	s.cut.Cut()
	if s.fate.CompareAndSwap(streaming, streamAbandoned) {
		s.of.abandoned.Add(1)
	}
	s.release()
}

func (s *stream) release() { s.slot.Do(func() { <-s.of.running }) }
