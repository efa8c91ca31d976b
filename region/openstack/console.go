package openstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/remoteconsoles"
	"github.com/gorilla/websocket"

	"github.com/computeql/computeql/region"
)

// consoleMessageLimit bounds one message of Nova's serial console proxy: the proxy relays what
// it reads from QEMU in pieces of a few KiB.
const consoleMessageLimit = 64 << 10

// OpenConsole attaches to the server's serial console through Nova's serial console proxy:
// Nova's remote console of protocol serial is a WebSocket URL with a one-time token, whose
// binary messages carry the console's bytes both ways. A cloud whose computes have no serial
// console (nova.conf [serial_console] enabled = false, or no nova-serialproxy) refuses it with
// its own reason. QEMU takes one client on a serial port at a time, so a later attachment of
// this process to the same server detaches the earlier one (its reads end with io.EOF); one of
// another process waits until the earlier one is closed.
func (d *Driver) OpenConsole(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	s, err := d.nova(ctx, id)
	if err != nil {
		return nil, err
	}
	if state := toServer(s, nil).State; state != region.ServerRunning {
		return nil, fmt.Errorf("console: the server is %s: %w", state, region.ErrRefused)
	}
	// QEMU serves the port to one client: the earlier attachment goes first.
	d.attachConsole(id, nil)
	var rc *remoteconsoles.RemoteConsole
	err = d.call(ctx, "open the serial console of server "+id, func(ctx context.Context, c *clients) error {
		rc, err = remoteconsoles.Create(ctx, c.compute, id, remoteconsoles.CreateOpts{
			Protocol: remoteconsoles.ConsoleProtocolSerial, Type: remoteconsoles.ConsoleTypeSerial,
		}).Extract()
		return err
	})
	if err != nil {
		return nil, notFoundAs(err, region.ErrServerNotFound)
	}
	dialer := websocket.Dialer{HandshakeTimeout: d.requestTimeout, Subprotocols: []string{"binary"}}
	dctx, cancel := context.WithTimeout(ctx, d.requestTimeout)
	defer cancel()
	ws, resp, err := dialer.DialContext(dctx, rc.URL, http.Header{})
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("openstack: connect to the serial console proxy of server %s: %w: %w", id, err, region.ErrUnavailable)
	}
	ws.SetReadLimit(consoleMessageLimit)
	c := &serialConsole{ws: ws}
	c.release = func() {
		d.consoleMu.Lock()
		if d.consoles[id] == c {
			delete(d.consoles, id)
		}
		d.consoleMu.Unlock()
	}
	d.attachConsole(id, c)
	return c, nil
}

// attachConsole makes c (nil for none) the process's attachment to the server's console, and
// detaches the one before it.
func (d *Driver) attachConsole(id string, c *serialConsole) {
	d.consoleMu.Lock()
	earlier := d.consoles[id]
	if c == nil {
		delete(d.consoles, id)
	} else {
		if d.consoles == nil {
			d.consoles = map[string]*serialConsole{}
		}
		d.consoles[id] = c
	}
	d.consoleMu.Unlock()
	if earlier != nil {
		earlier.detach()
	}
}

// serialConsole is one attachment to a serial console, over the proxy's WebSocket.
type serialConsole struct {
	ws      *websocket.Conn
	release func()

	readMu  sync.Mutex
	pending []byte // what is left of the message last read

	writeMu sync.Mutex

	closeOnce sync.Once
	closeErr  error
	detached  atomic.Bool
}

// Read returns what the guest wrote; io.EOF once the console went away (the proxy closed it,
// or another attachment took it).
func (c *serialConsole) Read(p []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	for len(c.pending) == 0 {
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if c.detached.Load() || errors.As(err, &ce) {
				return 0, io.EOF
			}
			return 0, err
		}
		c.pending = data
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// Write types p into the console.
func (c *serialConsole) Write(p []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close detaches.
func (c *serialConsole) Close() error {
	c.closeOnce.Do(func() {
		if c.release != nil {
			c.release()
		}
		c.closeErr = c.ws.Close()
	})
	return c.closeErr
}

// detach ends the attachment for another one of the same console.
func (c *serialConsole) detach() {
	c.detached.Store(true)
	c.Close()
}
