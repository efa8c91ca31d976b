package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
	"github.com/computeql/computeql/store"
)

// changes records when the benchmark changed each instance's server, so that whoever
// receives the resulting events (the event log, subscribers) can tell which change an event
// shows and how long it took. Change k of an instance sets its server's health to DEGRADED
// when k is even and HEALTHY when odd: servers run HEALTHY after their build, so every
// change is a visible change of health, and the health an event carries names the change.
// Changes of one instance must lie further apart than their propagation takes, or the
// workers may see two as none; the phases space them by seconds.
type changes struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func newChanges() *changes { return &changes{at: map[string][]time.Time{}} }

// healthOf is the health change k of an instance sets.
func healthOf(k int) region.ServerHealth {
	if k%2 == 0 {
		return region.HealthDegraded
	}
	return region.HealthHealthy
}

// record notes that the instance's next change is made now and returns its number.
func (c *changes) record(id string, at time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at[id] = append(c.at[id], at)
	return len(c.at[id]) - 1
}

// count is how many changes of the instance were made: the number of the next.
func (c *changes) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.at[id])
}

// match reports whether an event showing the instance with the health, received at, is the
// change *next that its receiver waits for, and then how long it took; it advances *next.
// Events of other changes, or with no change of health, do not match.
func (c *changes) match(id string, next *int, health string, at time.Time) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	times := c.at[id]
	if *next >= len(times) || health != string(healthOf(*next)) {
		return 0, false
	}
	d := at.Sub(times[*next])
	*next++
	return d, true
}

// target is an instance with its backing server.
type target struct {
	instance, server string
}

// servers finds the backing server of each instance, from up to 16 goroutines.
func servers(ctx context.Context, cloud *sim.Sim, scope region.Scope, ids []string) ([]target, error) {
	out := make([]target, len(ids))
	work := make(chan int)
	errc := make(chan error, len(ids))
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range work {
				found, err := cloud.FindServers(ctx, scope, region.InstanceTag, ids[i])
				if err == nil && len(found) != 1 {
					err = fmt.Errorf("%d servers", len(found))
				}
				if err != nil {
					errc <- fmt.Errorf("server of instance %s: %w", ids[i], err)
					continue
				}
				out[i] = target{instance: ids[i], server: found[0].ID}
			}
		})
	}
	for i := range ids {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return nil, err
	}
	return out, nil
}

// flip changes the health of the targets' servers, one after another in turn, at rate per
// second for d, as the region's own monitoring would. Each change is recorded, and expect
// told of it, before it is made, so that no receiver can see it first. It returns how many
// changes it made.
func flip(ctx context.Context, cloud *sim.Sim, targets []target, rate float64, d time.Duration, ch *changes, expect func(id string)) (int, error) {
	if len(targets) == 0 || rate <= 0 {
		return 0, nil
	}
	start := time.Now()
	n := int(rate * d.Seconds())
	for i := range n {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if !pause(ctx, time.Until(at)) {
			return i, ctx.Err()
		}
		t := targets[i%len(targets)]
		k := ch.record(t.instance, time.Now())
		expect(t.instance)
		if err := cloud.SetHealth(ctx, t.server, healthOf(k)); err != nil {
			return i, fmt.Errorf("change server %s: %w", t.server, err)
		}
	}
	return n, nil
}

// tail follows an organization's event log from its current end, calling fn with every
// record and the moment it was read: the moment the commit became visible in Redis, plus one
// blocking read's wake-up. It is how commits are timed from outside the workers.
type tail struct {
	cancel context.CancelFunc
	done   chan error
	// failed is closed when the tail stopped on an error: whoever waits on it can stop.
	failed chan struct{}
}

// startTail starts following the log; the caller must stop the tail.
func startTail(ctx context.Context, st *store.Store, org string, fn func(*instance.Record, time.Time)) (*tail, error) {
	after, err := st.LastEvent(ctx, org)
	if err != nil {
		return nil, fmt.Errorf("follow events of %s: %w", org, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	t := &tail{cancel: cancel, done: make(chan error, 1), failed: make(chan struct{})}
	go func() {
		for ctx.Err() == nil {
			// A short block lets stop end the tail promptly.
			recs, err := st.ReadEvents(ctx, org, after, 100*time.Millisecond)
			if err != nil {
				if ctx.Err() == nil {
					t.done <- fmt.Errorf("follow events of %s: %w", org, err)
					close(t.failed)
					return
				}
				break
			}
			at := time.Now()
			for i := range recs {
				fn(&recs[i], at)
				after = recs[i].Cursor
			}
		}
		t.done <- nil
	}()
	return t, nil
}

// stop ends the tail and returns why it failed, if it did.
func (t *tail) stop() error {
	t.cancel()
	return <-t.done
}

// tally counts receipts (commits seen, events delivered) against the receipts expected, and
// tells when all came.
type tally struct {
	mu       sync.Mutex
	expected int
	got      int
	sealed   bool
	all      chan struct{}
}

func newTally() *tally { return &tally{all: make(chan struct{})} }

// expect adds n expected receipts.
func (t *tally) expect(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expected += n
}

// receive counts one receipt.
func (t *tally) receive() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.got++
	t.check()
}

// seal says no more receipts will be expected: from now on, all in means done.
func (t *tally) seal() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sealed = true
	t.check()
}

func (t *tally) check() {
	if t.sealed && t.got >= t.expected {
		select {
		case <-t.all:
		default:
			close(t.all)
		}
	}
}

// counts returns the receipts so far and those expected.
func (t *tally) counts() (got, expected int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.got, t.expected
}

// wait returns once every expected receipt came, or limit passed, or ctx ended, or abort
// was closed (nil: never); it returns how many are missing.
func (t *tally) wait(ctx context.Context, limit time.Duration, abort <-chan struct{}) int {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-t.all:
	case <-timer.C:
	case <-ctx.Done():
	case <-abort:
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return max(t.expected-t.got, 0)
}
