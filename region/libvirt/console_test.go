package libvirt

import (
	"bytes"
	"errors"
	"io"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/libvirt/dial"
)

// TestConsoleSinkNeverFails: the receiving end of a console stream takes every packet the
// host connection hands it, past the backlog too (an error there would wedge the connection's
// receive loop), and past the backlog ends the reads with ErrConsoleOverrun and finishes the
// stream, once per packet that did not fit.
func TestConsoleSinkNeverFails(t *testing.T) {
	out := region.NewConsoleBuffer(8)
	finished := 0
	sink := consoleSink{out: out, finish: func() { finished++ }}
	for i, p := range []string{"12345", "678", "9", "more"} {
		if n, err := sink.Write([]byte(p)); n != len(p) || err != nil {
			t.Errorf("packet %d: %d, %v; want all %d bytes taken", i, n, err, len(p))
		}
	}
	if finished != 2 {
		t.Errorf("the stream was finished %d times, want once per packet past the backlog (2)", finished)
	}
	if _, err := out.Read(make([]byte, 16)); !errors.Is(err, region.ErrConsoleOverrun) {
		t.Errorf("reads after the overrun: %v, want ErrConsoleOverrun", err)
	}
}

// TestLastBytesKeepsTheTail: whatever the writes, what is kept is the last max bytes of all
// that was written, and dropped says whether anything came before them.
func TestLastBytesKeepsTheTail(t *testing.T) {
	for _, tt := range []struct {
		name    string
		writes  []string
		want    string
		dropped bool
	}{
		{"nothing", nil, "", false},
		{"less than max", []string{"ab", "c"}, "abc", false},
		{"exactly max", []string{"ab", "cd"}, "abcd", false},
		{"one write past max", []string{"abcdef"}, "cdef", true},
		{"one write of max after others", []string{"x", "abcd"}, "abcd", true},
		{"writes past max", []string{"abc", "def", "g"}, "defg", true},
		{"an empty write", []string{"abcd", ""}, "abcd", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := &lastBytes{max: 4}
			for _, w := range tt.writes {
				if n, err := l.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if string(l.buf) != tt.want || l.dropped != tt.dropped {
				t.Errorf("kept %q (dropped %t), want %q (dropped %t)", l.buf, l.dropped, tt.want, tt.dropped)
			}
		})
	}
}

// TestStreamsAreBounded: streams, each on a connection of its own, never run more than their
// kind's bound at once against a host, nor once its bound of streams were left behind
// (go-libvirt wedged their connections): past either a stream is refused as unavailable,
// before it dials, whether a console download or an attached console.
func TestStreamsAreBounded(t *testing.T) {
	full := func() *hostDriver {
		d := &hostDriver{downloads: newStreams("console downloads", consoleDownloads, abandonedStreams),
			consoles: newStreams("consoles", consoleStreams, abandonedStreams)}
		for range consoleDownloads {
			d.downloads.running <- struct{}{}
		}
		for range consoleStreams {
			d.consoles.running <- struct{}{}
		}
		return d
	}
	stuck := func() *hostDriver {
		d := &hostDriver{downloads: newStreams("console downloads", consoleDownloads, abandonedStreams),
			consoles: newStreams("consoles", consoleStreams, abandonedStreams)}
		d.downloads.abandoned.Store(abandonedStreams)
		d.consoles.abandoned.Store(abandonedStreams)
		return d
	}
	for name, d := range map[string]*hostDriver{"running": full(), "abandoned": stuck()} {
		running := len(d.downloads.running)
		if err := d.download(t.Context(), golibvirt.StorageVol{}, io.Discard, 0, 0); !errors.Is(err, region.ErrUnavailable) {
			t.Errorf("a download past the %s ones: %v, want ErrUnavailable", name, err)
		}
		if _, err := d.openStream(d.consoles); !errors.Is(err, region.ErrUnavailable) {
			t.Errorf("a console past the %s ones: %v, want ErrUnavailable", name, err)
		}
		if len(d.downloads.running) != running {
			t.Errorf("past the %s ones, a refused download left %d slots taken, want %d", name, len(d.downloads.running), running)
		}
	}
}

// TestStreamLeftBehindIsCountedUntilItReturns: a stream left behind gives its slot back at
// once and is counted as abandoned until its call returns, in either order; its slot is given
// back once only.
func TestStreamLeftBehindIsCountedUntilItReturns(t *testing.T) {
	of := newStreams("consoles", 2, abandonedStreams)
	open := func() *stream {
		of.running <- struct{}{}
		return &stream{cut: &dial.CutDialer{}, of: of}
	}
	left := open()
	left.abandon()
	if n, running := of.abandoned.Load(), len(of.running); n != 1 || running != 0 {
		t.Fatalf("left behind: %d abandoned, %d running; want 1 and 0", n, running)
	}
	left.returned(errors.New("connection cut"))
	if n, running := of.abandoned.Load(), len(of.running); n != 0 || running != 0 {
		t.Fatalf("its call returned: %d abandoned, %d running; want 0 and 0", n, running)
	}

	done := open()
	done.returned(errors.New("the guest went away"))
	done.abandon() // a Close after the stream ended on its own
	if n, running := of.abandoned.Load(), len(of.running); n != 0 || running != 0 {
		t.Fatalf("returned, then closed: %d abandoned, %d running; want 0 and 0", n, running)
	}
}

// TestCountingWriterSaysWhenAllCame: a download of a length is over once that many bytes went
// through, and not before; one of the whole file (want 0) never says so.
func TestCountingWriterSaysWhenAllCame(t *testing.T) {
	var buf bytes.Buffer
	c := &countingWriter{w: &buf, want: 5, got: make(chan struct{})}
	for i, p := range []string{"ab", "cd", "e", "f"} {
		if _, err := c.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-c.got:
			if i < 2 {
				t.Fatalf("over after %q, with %d of 5 bytes", buf.String(), c.n)
			}
		default:
			if i >= 2 {
				t.Fatalf("not over after %q", buf.String())
			}
		}
	}
	whole := &countingWriter{w: io.Discard, got: make(chan struct{})}
	if _, err := whole.Write([]byte("everything")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-whole.got:
		t.Error("a download to the file's end said it was over")
	default:
	}
	if buf.String() != "abcdef" {
		t.Errorf("passed on %q, want every byte", buf.String())
	}
}
