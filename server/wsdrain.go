package server

import (
	"sync/atomic"
	"time"
)

// drainers answer woken subscriptions on goroutines that outlive one delivery. A goroutine
// started for each delivery begins with Go's 2 KiB stack and grows it, by copying, to the depth
// that executing and marshalling an event takes, every time: in a fan-out to 10,000
// subscribers that copying was a fifth of the API's CPU. An idle drainer waits a while for more
// work; when none is waiting, the work gets a new drainer, or past max a goroutine of its own,
// so that a drainer held up by a slow peer's write holds up no other subscription.
type drainers struct {
	work chan func() // unbuffered: a send goes through only to a drainer waiting for it
	max  int32
	n    atomic.Int32 // drainers alive
	// idle is how long a drainer waits for more work before it ends; done ends it at once
	// (the server's end).
	idle time.Duration
	done <-chan struct{}
}

func newDrainers(max int, idle time.Duration, done <-chan struct{}) *drainers {
	return &drainers{work: make(chan func()), max: int32(max), idle: idle, done: done}
}

// run runs f (an operation's drain) on a drainer or a goroutine of its own; it never waits.
func (d *drainers) run(f func()) {
	select {
	case d.work <- f:
		return
	default:
	}
	if d.n.Add(1) <= d.max {
		go d.loop(f)
		return
	}
	d.n.Add(-1)
	go f()
}

func (d *drainers) loop(f func()) {
	defer d.n.Add(-1)
	idle := time.NewTimer(d.idle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(d.idle)
		select {
		case f = <-d.work:
		case <-idle.C:
			return
		case <-d.done:
			return
		}
	}
}
