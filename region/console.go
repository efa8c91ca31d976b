package region

import (
	"errors"
	"io"
	"sync"
)

// ConsoleBacklog is how far behind its server an attached console may fall: what the guest
// writes waits in a buffer of this size for the reader, and a reader slower than that is cut
// off (ErrConsoleOverrun) rather than slowing the host connection every other call shares.
const ConsoleBacklog = 256 << 10

// ErrConsoleOverrun ends an attached console whose reader fell ConsoleBacklog behind.
var ErrConsoleOverrun = errors.New("the console's reader fell too far behind its output")

// ConsoleBuffer carries a console's output from a writer that must never block (a host
// connection's receive loop, a simulated guest) to one reader that may. It holds at most its
// size; a write past that fails with ErrConsoleOverrun and ends the buffer.
type ConsoleBuffer struct {
	mu    sync.Mutex
	ready *sync.Cond
	buf   []byte
	max   int
	err   error // set once: reads return it after the buffer drained
}

// NewConsoleBuffer returns an empty buffer that holds at most max bytes.
func NewConsoleBuffer(max int) *ConsoleBuffer {
	b := &ConsoleBuffer{max: max}
	b.ready = sync.NewCond(&b.mu)
	return b
}

// Write appends p without blocking.
func (b *ConsoleBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	if len(b.buf)+len(p) > b.max {
		b.err = ErrConsoleOverrun
		b.buf = nil
		b.ready.Broadcast()
		return 0, ErrConsoleOverrun
	}
	b.buf = append(b.buf, p...)
	b.ready.Broadcast()
	return len(p), nil
}

// Read blocks until there are bytes to return or the buffer ended; after the end, it returns
// what is left, then the error it ended with.
func (b *ConsoleBuffer) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.buf) == 0 && b.err == nil {
		b.ready.Wait()
	}
	if len(b.buf) == 0 {
		return 0, b.err
	}
	n := copy(p, b.buf)
	b.buf = b.buf[n:]
	if len(b.buf) == 0 {
		b.buf = nil // an idle console holds no buffer
	}
	return n, nil
}

// CloseWithError ends the buffer: reads drain it, then return err (io.EOF when nil). Only the
// first end counts.
func (b *ConsoleBuffer) CloseWithError(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		err = io.EOF
	}
	if b.err == nil {
		b.err = err
		b.ready.Broadcast()
	}
}

// Close ends the buffer as CloseWithError(nil) does.
func (b *ConsoleBuffer) Close() error {
	b.CloseWithError(nil)
	return nil
}
