package region_test

import (
	"errors"
	"io"
	"testing"

	"github.com/computeql/computeql/region"
)

// TestConsoleBuffer: writes never wait; a write past the buffer's size ends it with
// ErrConsoleOverrun and drops what it held; reads drain what was written before the end, then
// return the error the buffer ended with.
func TestConsoleBuffer(t *testing.T) {
	read := func(b *region.ConsoleBuffer) (string, error) {
		p := make([]byte, 16)
		n, err := b.Read(p)
		return string(p[:n]), err
	}
	t.Run("drains, then ends", func(t *testing.T) {
		b := region.NewConsoleBuffer(8)
		b.Write([]byte("abc"))
		b.Write([]byte("de"))
		b.CloseWithError(nil)
		if got, err := read(b); got != "abcde" || err != nil {
			t.Errorf("read %q (%v), want abcde", got, err)
		}
		if _, err := read(b); !errors.Is(err, io.EOF) {
			t.Errorf("read after the end: %v, want io.EOF", err)
		}
		if _, err := b.Write([]byte("f")); err == nil {
			t.Errorf("write after the end succeeded")
		}
	})
	t.Run("overrun", func(t *testing.T) {
		b := region.NewConsoleBuffer(4)
		if n, err := b.Write([]byte("abcd")); n != 4 || err != nil {
			t.Fatalf("write up to the size: %d, %v", n, err)
		}
		if _, err := b.Write([]byte("e")); !errors.Is(err, region.ErrConsoleOverrun) {
			t.Errorf("write past the size: %v, want ErrConsoleOverrun", err)
		}
		if got, err := read(b); got != "" || !errors.Is(err, region.ErrConsoleOverrun) {
			t.Errorf("read after the overrun: %q (%v), want nothing and ErrConsoleOverrun", got, err)
		}
	})
	t.Run("a read waits for a write", func(t *testing.T) {
		b := region.NewConsoleBuffer(4)
		got := make(chan string)
		go func() { s, _ := read(b); got <- s }()
		b.Write([]byte("x"))
		if s := <-got; s != "x" {
			t.Errorf("the waiting read got %q, want x", s)
		}
		closed := make(chan error)
		go func() { _, err := read(b); closed <- err }()
		b.CloseWithError(region.ErrUnavailable)
		if err := <-closed; !errors.Is(err, region.ErrUnavailable) {
			t.Errorf("the waiting read ended with %v, want the buffer's error", err)
		}
	})
}
