// Package roundtrip shares round trips among concurrent callers.
//
// A round trip to Redis costs both ends far more than most commands it carries: a system call
// or two on each side, a wake-up of Redis's event loop, a pooled connection taken and given
// back. When many callers each send a little at once (an API answering many creates, many
// keys added to a queue), most of the CPU goes to the round trips. A Shared lets a few callers
// make their own round trips, so that a lone caller never waits in line for another's reply,
// and sends what the others bring while those are under way together, in one round trip, as
// soon as one ends.
package roundtrip

import (
	"context"
	"sync"
	"time"
)

// Shared runs the calls of concurrent callers, each an item of type T. The zero value is not
// usable; call Share.
type Shared[T any] struct {
	most     int
	alone    func(context.Context, T)
	together func(context.Context, []T)

	mu sync.Mutex
	// under counts the round trips under way, at most most; waiting holds the items that came
	// while that many were.
	under   int
	waiting []waiter[T]
}

// waiter is an item waiting for a shared round trip; done is closed once it ran.
type waiter[T any] struct {
	item T
	done chan struct{}
}

// sharedTimeout bounds one shared round trip: it serves several callers, so no one caller's
// context may cut it short.
const sharedTimeout = 5 * time.Second

// Share returns a Shared that has at most most round trips under way at once: alone makes one
// for a single item, under its caller's context; together makes one for the items of several
// callers, in the order they came, under a context that ends after sharedTimeout. Each leaves
// its outcome in the items, for the callers to read.
func Share[T any](most int, alone func(context.Context, T), together func(context.Context, []T)) *Shared[T] {
	return &Shared[T]{most: max(most, 1), alone: alone, together: together}
}

// Do runs item's call and returns once it ran; the item then holds its outcome. While fewer
// than the most round trips are under way the caller makes its own, which ends with ctx;
// otherwise the item goes in the next shared one. A caller whose ctx ends while its item
// waits gets ctx's error, and the item may run all the same (as when a reply is lost): the
// caller must not read it then.
func (s *Shared[T]) Do(ctx context.Context, item T) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.under < s.most {
		s.under++
		s.mu.Unlock()
		s.alone(ctx, item)
		s.mu.Lock()
		if len(s.waiting) == 0 {
			s.under--
		} else {
			go s.runWaiting() // carries this round trip's slot on
		}
		s.mu.Unlock()
		return nil
	}
	w := waiter[T]{item: item, done: make(chan struct{})}
	s.waiting = append(s.waiting, w)
	s.mu.Unlock()
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runWaiting runs the items that came while round trips were under way, all of those waiting
// at a time, until none is left.
func (s *Shared[T]) runWaiting() {
	for {
		s.mu.Lock()
		waiting := s.waiting
		s.waiting = nil
		if len(waiting) == 0 {
			s.under--
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		items := make([]T, len(waiting))
		for i, w := range waiting {
			items[i] = w.item
		}
		ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
		s.together(ctx, items)
		cancel()
		for _, w := range waiting {
			close(w.done)
		}
	}
}

// Waiting counts the items waiting for a shared round trip.
func (s *Shared[T]) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}
