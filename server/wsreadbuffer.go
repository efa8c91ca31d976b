package server

import (
	"bufio"
	"net"
	"net/http"
)

// wsReadBufferSize is the size of a socket's frame-reading buffer: more than 256 bytes, so
// that gorilla reads frames through the buffer Hijack hands it (see ownReadBuffer) instead of
// making one of its own, and a size class of Go's allocator, so that no byte of it is wasted.
// Client messages (init, subscribe, complete) are small; a larger one is read in pieces.
const wsReadBufferSize = 288

// ownReadBuffer wraps the handshake's ResponseWriter so that the connection it hijacks reads
// through a buffer the transport holds: the reader then knows when no byte of a frame is
// buffered, which is when the socket may wait in the poller (see idlePoller.park).
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
