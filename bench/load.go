package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Load is what one run of requests measured. Latency counts answered requests, failed ones
// included: a quick refusal is a latency too, and the errors are counted beside it.
type Load struct {
	// Concurrency is the number of clients of a closed-loop run (0 for a fixed-rate run).
	Concurrency int `json:"concurrency,omitempty"`
	// OfferedRate is the requests per second a fixed-rate run sent (0 for a closed loop).
	OfferedRate float64 `json:"offeredRate,omitempty"`
	Requests    int     `json:"requests"`
	Errors      int     `json:"errors"`
	// FirstError is the first failure, to tell what went wrong without the logs.
	FirstError string     `json:"firstError,omitempty"`
	Throughput Throughput `json:"throughput"`
	Latency    Latency    `json:"latency"`
	// CPU is what a request cost each process, for the runs that measure it.
	CPU *CPUCost `json:"cpu,omitempty"`
}

// request sends request number i and returns its failure, if any.
type request func(ctx context.Context, i int) error

// sample collects what the goroutines of one run measured.
type sample struct {
	mu        sync.Mutex
	latencies []time.Duration
	errors    int
	firstErr  error
}

// add merges one goroutine's measurements, taken without a lock.
func (s *sample) add(latencies []time.Duration, errs int, first error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latencies = append(s.latencies, latencies...)
	s.errors += errs
	if s.firstErr == nil {
		s.firstErr = first
	}
}

func (s *sample) load(elapsed time.Duration) Load {
	l := Load{
		Requests:   len(s.latencies),
		Errors:     s.errors,
		Throughput: throughput(len(s.latencies), elapsed),
		Latency:    summarize(s.latencies),
	}
	if s.firstErr != nil {
		l.FirstError = s.firstErr.Error()
	}
	return l
}

// closedLoop sends requests from clients goroutines, each sending its next as soon as its
// last was answered, until n requests were sent (when n > 0), d has passed (when d > 0) or
// ctx ends. It is the load of a fixed number of users: throughput is what the system gives.
func closedLoop(ctx context.Context, clients, n int, d time.Duration, do request) Load {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var deadline time.Time
	start := time.Now()
	if d > 0 {
		deadline = start.Add(d)
	}
	var next atomic.Int64
	var s sample
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			var own []time.Duration
			errs := 0
			var first error
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if n > 0 && i >= n {
					break
				}
				t := time.Now()
				if !deadline.IsZero() && !t.Before(deadline) {
					break
				}
				err := do(ctx, i)
				own = append(own, time.Since(t))
				if err != nil {
					errs++
					if first == nil {
						first = err
					}
				}
			}
			s.add(own, errs, first)
		})
	}
	wg.Wait()
	l := s.load(time.Since(start))
	l.Concurrency = clients
	return l
}

// openLoop starts request i at start + i/rate for d, whether or not earlier ones were
// answered, with at most maxInFlight outstanding. Latency counts from the time a request was
// due, so a system that falls behind shows it in its latencies instead of silently being
// sent less (no coordinated omission).
func openLoop(ctx context.Context, rate float64, d time.Duration, maxInFlight int, do request) Load {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type due struct {
		i  int
		at time.Time
	}
	work := make(chan due)
	var s sample
	var wg sync.WaitGroup
	for range maxInFlight {
		wg.Go(func() {
			var own []time.Duration
			errs := 0
			var first error
			for r := range work {
				err := do(ctx, r.i)
				own = append(own, time.Since(r.at))
				if err != nil {
					errs++
					if first == nil {
						first = err
					}
				}
			}
			s.add(own, errs, first)
		})
	}
	start := time.Now()
	n := int(rate * d.Seconds())
	for i := 0; i < n && ctx.Err() == nil; i++ {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if !pause(ctx, time.Until(at)) {
			break
		}
		select {
		case work <- due{i, at}:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	l := s.load(time.Since(start))
	l.OfferedRate = rate
	return l
}

// pause waits for d (nothing when d ≤ 0) and reports whether ctx is still live.
func pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
