// Package eventually is for tests that must wait on state another process or goroutine
// changes with no event of its own to await: the region's clock, the workers, Redis. It polls
// with a deadline; where an event can be awaited, tests await it instead.
package eventually

import (
	"testing"
	"time"
)

// pollEvery is short next to every limit the tests give, and long enough not to starve the
// goroutines being waited on of the two cores.
const pollEvery = 3 * time.Millisecond

// Holds polls cond until it holds, failing the test after limit with the message.
func Holds(tb testing.TB, limit time.Duration, cond func() bool, format string, args ...any) {
	tb.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("not within %s: "+format, append([]any{limit}, args...)...)
		}
		time.Sleep(pollEvery)
	}
}

// Lazy formats as what f returns at the moment it is formatted, so that the arguments of a
// Holds message, given before the wait, show what the wait saw last when it fails.
type Lazy func() string

func (f Lazy) String() string { return f() }
