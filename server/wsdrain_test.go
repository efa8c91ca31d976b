package server

import (
	"sync"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
)

// TestDrainersOutliveTheirWork: a drainer, once started, takes work after work (a send to it
// waits until it is back) without another starting, and ends after it has been idle a while.
func TestDrainersOutliveTheirWork(t *testing.T) {
	d := newDrainers(4, 200*time.Millisecond, nil)
	done := make(chan int)
	d.run(func() { done <- 0 })
	<-done
	for i := 1; i < 50; i++ {
		d.work <- func() { done <- i }
		if got := <-done; got != i {
			t.Fatalf("ran %d, want %d", got, i)
		}
	}
	if n := d.n.Load(); n != 1 {
		t.Errorf("%d drainers after 50 runs one at a time, want 1", n)
	}
	eventually.Holds(t, 5*time.Second, func() bool { return d.n.Load() == 0 }, "the idle drainer did not end")
}

// TestDrainersNeverWait: with every drainer held up (a slow peer's write), more work still
// runs at once, on goroutines of its own, and run never waits.
func TestDrainersNeverWait(t *testing.T) {
	d := newDrainers(2, time.Minute, nil)
	release := make(chan struct{})
	var held sync.WaitGroup
	held.Add(2)
	for range 2 {
		d.run(func() { held.Done(); <-release })
	}
	held.Wait()
	ran := make(chan struct{})
	d.run(func() { close(ran) })
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("work waited behind the held-up drainers")
	}
	if n := d.n.Load(); n != 2 {
		t.Errorf("%d drainers, want the 2 at most", n)
	}
	close(release)
}

// TestDrainersEndWithTheServer: an idle drainer ends when the server's lifetime does, not
// only after its idle time.
func TestDrainersEndWithTheServer(t *testing.T) {
	done := make(chan struct{})
	d := newDrainers(2, time.Hour, done)
	ran := make(chan struct{})
	d.run(func() { close(ran) })
	<-ran
	close(done)
	eventually.Holds(t, 5*time.Second, func() bool { return d.n.Load() == 0 }, "a drainer outlived the server")
}
