// Package dial connects to libvirt hosts in a way that can be cut: go-libvirt's calls carry no
// deadline, and cutting the connection is what fails a call waiting on a host that does not
// answer. The region driver and the test hosts both use it.
package dial

import (
	"errors"
	"net"
	"sync"
	"time"
)

// CutDialer dials a libvirt host and keeps the connection, so that it can be cut: go-libvirt's
// calls carry no deadline, and cutting the connection is what fails a call waiting on a host
// that does not answer. One dials once; Cut works before, during or after the dial.
type CutDialer struct {
	Network, Address string
	Timeout          time.Duration
	// Through, when set, reaches the host through the connection dialled (e.g. logs in over
	// SSH and opens the daemon's socket there) and returns what to talk to it on. Cut still
	// closes the connection dialled, which ends what runs through it.
	Through func(net.Conn) (net.Conn, error)

	mu     sync.Mutex
	conn   net.Conn
	closed bool
}

// Dial implements go-libvirt's socket.Dialer.
func (d *CutDialer) Dial() (net.Conn, error) {
	c, err := net.DialTimeout(d.Network, d.Address, d.Timeout)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		c.Close()
		return nil, errors.New("the connection was cut before it was made")
	}
	d.conn = c
	if d.Through == nil {
		return c, nil
	}
	// The connection is held while Through talks on it, so that a Cut fails it too.
	d.mu.Unlock()
	through, err := d.Through(c)
	d.mu.Lock()
	if err == nil && d.closed {
		through.Close()
		err = errors.New("the connection was cut while it was made")
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return through, nil
}

// Cut closes the connection, now or as soon as it is made.
func (d *CutDialer) Cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.conn != nil {
		d.conn.Close()
	}
}
