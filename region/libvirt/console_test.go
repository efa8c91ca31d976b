package libvirt

import (
	"errors"
	"testing"

	"github.com/computeql/computeql/region"
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
