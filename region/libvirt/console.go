package libvirt

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/computeql/computeql/region"
)

// consoleLogName is the pool volume the server's serial console is written to.
func consoleLogName(id string) string { return namePrefix + id + "-console.log" }

// ConsoleOutput implements region.Client. QEMU appends everything the guest writes to its
// serial port to a file in the region's storage pool, so it is read through the pool like a
// disk: from any process, over any connection to the host.
func (d *hostDriver) ConsoleOutput(ctx context.Context, id string, tailBytes int) (region.ConsoleOutput, error) {
	conn, err := d.host("console output")
	if err != nil {
		return region.ConsoleOutput{}, err
	}
	s, err := d.lookup(conn, id)
	if err != nil {
		return region.ConsoleOutput{}, fmt.Errorf("console output: %w", err)
	}
	now := d.opts.Now()
	if !hasConsoleLog(s) {
		return region.TailText(nil, tailBytes, now), nil // made before its console was kept, or never made
	}
	d.mu.RLock()
	pool := d.pool
	d.mu.RUnlock()
	vol, err := conn.StorageVolLookupByName(pool, consoleLogName(s.id))
	if isCode(err, golibvirt.ErrNoStorageVol) {
		// QEMU made the file after the pool last looked: the pool learns of it.
		if err = conn.StoragePoolRefresh(pool, 0); err == nil {
			vol, err = conn.StorageVolLookupByName(pool, consoleLogName(s.id))
		}
	}
	if isCode(err, golibvirt.ErrNoStorageVol) {
		return region.TailText(nil, tailBytes, now), nil // the guest never started
	}
	if err != nil {
		return region.ConsoleOutput{}, d.fault("console output", err)
	}
	// The file's own size: a pool that probed the guest's output as some disk format would
	// report that format's capacity. The download is of the tail up to it; a size of 0 may be
	// older than the file (a run read 0 bytes of a booted guest's console), and then the
	// download goes on to the file's end, keeping only the tail.
	_, _, size, err := conn.StorageVolGetInfoFlags(vol, uint32(golibvirt.StorageVolGetPhysical))
	if err != nil {
		return region.ConsoleOutput{}, d.fault("console output", err)
	}
	tail := min(uint64(tailBytes), region.ConsoleOutputMax)
	// One byte more than asked says whether anything came before the tail, and lets the cut
	// drop a character the tail would split.
	keep := &lastBytes{max: int(tail + 1)}
	from := size - min(size, tail+1)
	err = d.download(ctx, vol, keep, from, size-from)
	if err == nil && from > 0 && len(keep.buf) == 0 {
		// The file is shorter than libvirt said (the log was rotated): its whole tail.
		err = d.download(ctx, vol, keep, 0, 0)
		from = 0
	}
	if err != nil {
		return region.ConsoleOutput{}, d.fault("console output", err)
	}
	out := region.TailText(keep.buf, int(tail), now)
	out.Truncated = out.Truncated || keep.dropped || from > 0
	return out, nil
}

// consoleDownloads is how many console downloads may run at once against a host, and
// consoleStreams how many consoles may be attached, each on a connection of its own (see
// streams); past abandonedStreams of either kind left behind, more of that kind are refused.
const (
	consoleDownloads = 4
	consoleStreams   = 64
	abandonedStreams = 64
)

// downloadLimit bounds a console download: a log's tail is at most ConsoleOutputMax bytes.
const downloadLimit = 30 * time.Second

// download writes length bytes of vol from offset into w (0: to its end), on a connection of
// its own (streams). w has every byte by the time go-libvirt could wedge the connection, so a
// download of a length is over once w has it, whether or not the call returns; the connection
// is cut then.
func (d *hostDriver) download(ctx context.Context, vol golibvirt.StorageVol, w io.Writer, offset, length uint64) error {
	st, err := d.openStream(d.downloads)
	if err != nil {
		return fmt.Errorf("console output: %w", err)
	}
	counted := &countingWriter{w: w, want: length, got: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		err := st.conn.StorageVolDownload(vol, counted, offset, length, 0)
		st.release() // before the answer: a caller's next download finds the slot free
		done <- err
		st.returned(err)
	}()
	timer := time.NewTimer(downloadLimit)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-counted.got:
		err = nil
	case <-timer.C:
		err = fmt.Errorf("console output: the download took longer than %s: %w", downloadLimit, region.ErrUnavailable)
	case <-ctx.Done():
		err = ctx.Err()
	}
	st.abandon()
	return err
}

// countingWriter passes writes on to w and closes got once want bytes went through (never
// when want is 0).
type countingWriter struct {
	w       io.Writer
	want, n uint64
	got     chan struct{}
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	before := c.n
	c.n += uint64(n)
	if c.want > 0 && before < c.want && c.n >= c.want {
		close(c.got)
	}
	return n, err
}

// lastBytes keeps the last max bytes written to it: a download of a whole log costs no more
// memory than its tail.
type lastBytes struct {
	buf     []byte
	max     int
	dropped bool // bytes written before buf's were let go
}

func (l *lastBytes) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= l.max {
		l.dropped = l.dropped || len(l.buf) > 0 || len(p) > l.max
		l.buf = append(l.buf[:0], p[len(p)-l.max:]...)
		return n, nil
	}
	if over := len(l.buf) + len(p) - l.max; over > 0 {
		l.buf = append(l.buf[:0], l.buf[over:]...)
		l.dropped = true
	}
	l.buf = append(l.buf, p...)
	return n, nil
}

// hasConsoleLog reports whether the domain writes its serial console to the pool.
func hasConsoleLog(s *server) bool {
	if s.xml.Devices == nil {
		return false
	}
	for _, serial := range s.xml.Devices.Serials {
		if serial.Log != nil && serial.Log.File != "" {
			return true
		}
	}
	return false
}

// OpenConsole implements region.Client with libvirt's console stream of the server's serial
// port, forced: a newer attachment takes the console from an older one, whose reads then end,
// as virsh console --force does (libvirt serves one at a time).
func (d *hostDriver) OpenConsole(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	_, s, err := d.verb("open console", id)
	if err != nil {
		return nil, err
	}
	if !running(s) {
		return nil, fmt.Errorf("open console: the server is not running: %w", region.ErrRefused)
	}
	// On a connection of its own (streams): a console closed while the guest writes is the
	// race that wedges go-libvirt's connections.
	st, err := d.openStream(d.consoles)
	if err != nil {
		return nil, fmt.Errorf("open console: %w", err)
	}
	typed, typing := io.Pipe()
	c := &console{out: region.NewConsoleBuffer(region.ConsoleBacklog), typing: typing, done: make(chan struct{}), stream: st}
	// The stream runs until either end finishes it: the guest's console going away, or Close,
	// whose end of the typed input makes the connection finish the stream. The output is
	// written from the connection's receive loop, which must never wait on a slow reader, nor
	// see an error: go-libvirt's receive loop holds the connection's lock while it hands the
	// stream its packets, so a stream that gave up on them would leave the loop waiting for
	// it, and every call on the connection with it. The sink takes every packet without
	// blocking; past the backlog it drops them, ends the reads with ErrConsoleOverrun, and
	// finishes the stream as Close would.
	sink := consoleSink{out: c.out, finish: func() { typing.Close() }}
	go func() {
		defer close(c.done)
		err := st.conn.DomainOpenConsoleBidirectional(s.dom, golibvirt.OptString{}, typed, sink, uint32(golibvirt.DomainConsoleForce))
		c.out.CloseWithError(d.fault("console of server "+id, err)) // nil for a stream that ended well
		typed.Close()
		st.returned(err)
	}()
	return c, nil
}

// consoleSink is the receiving end of a console stream: it never blocks and never fails.
type consoleSink struct {
	out    *region.ConsoleBuffer
	finish func()
}

func (s consoleSink) Write(p []byte) (int, error) {
	if _, err := s.out.Write(p); err != nil {
		s.finish()
	}
	return len(p), nil
}

// consoleCloseWait bounds how long Close waits for the host to finish the stream: a host that
// never answers must not hold the caller, whose console then ends when the connection does.
const consoleCloseWait = 10 * time.Second

// console is an attached libvirt console; its goroutine ends with the stream, which Close
// finishes and waits for.
type console struct {
	out    *region.ConsoleBuffer
	typing *io.PipeWriter
	done   chan struct{}
	stream *stream
	close  sync.Once
}

func (c *console) Read(p []byte) (int, error) { return c.out.Read(p) }

// Write types p into the console; it waits for the connection to send it.
func (c *console) Write(p []byte) (int, error) { return c.typing.Write(p) }

// Close finishes the stream and waits, at most consoleCloseWait, for the host to end it; past
// that, the stream is left behind and its connection cut.
func (c *console) Close() error {
	c.close.Do(func() {
		c.typing.Close()
		t := time.NewTimer(consoleCloseWait)
		defer t.Stop()
		select {
		case <-c.done:
		case <-t.C:
			c.stream.abandon()
			c.out.CloseWithError(fmt.Errorf("the host did not finish the console stream within %s: %w", consoleCloseWait, region.ErrUnavailable))
		}
	})
	return nil
}
