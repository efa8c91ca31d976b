package chaos

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// echo serves a line-echo on loopback until the test ends, when it closes every connection
// and waits for its goroutines.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	closed := false
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				c.Close()
			}
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { io.Copy(c, c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string) {
	t.Helper()
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	got, err := r.ReadString('\n')
	if err != nil || got != line+"\n" {
		t.Fatalf("echo of %q: %q, %v", line, got, err)
	}
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// quiet is how long a stalled connection is watched for bytes that must not come: a stall
// that works never delivers them, however slow the machine.
const quiet = 200 * time.Millisecond

func TestProxyStallHoldsBytesUntilRestore(t *testing.T) {
	p := StartProxy(t, echo(t))
	c, r := dial(t, p.Addr)
	roundTrip(t, c, r, "before")
	if n := p.Stall(); n != 1 {
		t.Fatalf("Stall reports %d connections, want 1", n)
	}
	if _, err := c.Write([]byte("held\n")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(quiet))
	if got, err := r.ReadString('\n'); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read through a stalled proxy: %q, %v", got, err)
	}
	c.SetReadDeadline(time.Time{})
	p.Restore()
	if got, err := r.ReadString('\n'); err != nil || got != "held\n" {
		t.Fatalf("after Restore, the held line: %q, %v", got, err)
	}
	roundTrip(t, c, r, "after")
}

func TestProxyResetClosesAndRefusesUntilRestore(t *testing.T) {
	p := StartProxy(t, echo(t))
	c, r := dial(t, p.Addr)
	roundTrip(t, c, r, "before")
	if n := p.Reset(); n != 1 {
		t.Fatalf("Reset reports %d connections, want 1", n)
	}
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("a reset connection still reads")
	}
	refused, rr := dial(t, p.Addr)
	refused.Write([]byte("no\n"))
	if got, err := rr.ReadString('\n'); err == nil {
		t.Fatalf("a connection made during the reset echoed %q", got)
	}
	p.Restore()
	c2, r2 := dial(t, p.Addr)
	roundTrip(t, c2, r2, "after")
}
