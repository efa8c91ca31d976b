package server

import (
	"bufio"
	"net"
	"net/http"
	"syscall"
)

// wsReadBufferSize is the size of a socket's frame-reading buffer: more than 256 bytes, so
// that gorilla reads frames through the buffer Hijack hands it (see ownReadBuffer) instead of
// making one of its own, and a size class of Go's allocator, so that no byte of it is wasted.
// Client messages (init, subscribe, complete) are small; a larger one is read in pieces.
const wsReadBufferSize = 288

// ownReadBuffer wraps the handshake's ResponseWriter so that the connection it hijacks reads
// through a buffer the transport holds: the reader then knows when no byte of a frame is
// buffered, which is when it may wait for the socket itself (see readable).
type ownReadBuffer struct {
	http.ResponseWriter
	br *bufio.Reader
}

func (o *ownReadBuffer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(o.ResponseWriter).Hijack()
	if err != nil || brw.Reader.Buffered() > 0 {
		return nc, brw, err // gorilla refuses a client that spoke before the handshake ended
	}
	o.br = bufio.NewReaderSize(nc, wsReadBufferSize)
	return nc, bufio.NewReadWriter(o.br, brw.Writer), nil
}

// readable waits until the socket has a byte to read, or has ended, failed or passed its read
// deadline, without consuming anything: the frame reader then finds out which. The wait is
// shallow (a few frames above the poller), so a new goroutine doing it never grows its stack
// (see (*wsConn).read). It must only be called while the frame reader holds no buffered byte:
// the socket alone then tells whether a frame is coming.
func readable(rc syscall.RawConn) {
	rc.Read(peekReadable)
}

// peekReadable reports whether the socket is no longer merely empty: data, its end (a peek of
// 0 bytes) or an error. EAGAIN sends the poller to wait for readability, and then here again.
func peekReadable(fd uintptr) bool {
	var b [1]byte
	_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err != syscall.EAGAIN
}
