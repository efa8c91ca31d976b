// Package feed delivers organizations' event logs live to the subscribers of one process. One
// reader per organization with subscribers follows its log and fans each event out in
// process, so subscribers never cost a Redis connection each. Subscribers have bounded
// buffers: one that does not keep up is cut off, and never slows the others.
package feed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/instance"
)

// Log is the event log the feed follows.
type Log interface {
	// LastEvent is the position of the newest event ("0-0" when none).
	LastEvent(ctx context.Context, org string) (string, error)
	// ReadEvents waits up to block for events after the position.
	ReadEvents(ctx context.Context, org, after string, block time.Duration) ([]instance.Record, error)
	// EventsBetween returns the events after one position up to another, or
	// instance.ErrCursorExpired.
	EventsBetween(ctx context.Context, org, after, upTo string) ([]instance.Record, error)
}

// ErrSlowConsumer ends a subscription whose buffer filled up.
var ErrSlowConsumer = errors.New("the subscriber did not keep up with its events; resubscribe after the last cursor received")

// Options configure a Feed.
type Options struct {
	// Buffer is how many events may wait for one subscriber. Defaults to 256.
	Buffer int
	// Block is how long one read of the log waits; it bounds how long a reader lingers after
	// its last subscriber left. Defaults to 1s.
	Block time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Feed fans event logs out to subscribers. It is safe for concurrent use.
type Feed struct {
	log  Log
	opts Options
	ctx  context.Context

	mu   sync.Mutex
	orgs map[string]*orgFeed
	// stops counts readers stopped by their last subscriber's leave. A position read while
	// one stopped may predate events that reader fanned out: it is read again.
	stops uint64
	wg    sync.WaitGroup

	delivered, dropped prometheus.Counter
}

// New returns a feed of the log whose readers live until ctx ends.
func New(ctx context.Context, log Log, opts Options) *Feed {
	if opts.Buffer == 0 {
		opts.Buffer = 256
	}
	if opts.Block == 0 {
		opts.Block = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Feed{log: log, opts: opts, ctx: ctx, orgs: map[string]*orgFeed{},
		delivered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "computeql_feed_events_delivered_total",
			Help: "Events handed to subscribers of this process (one per subscriber per event).",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "computeql_feed_events_dropped_total",
			Help: "Events a subscriber's full buffer could not take; each ends that subscription as a slow consumer.",
		}),
	}
}

// Register adds the feed's metrics to reg.
func (f *Feed) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{f.delivered, f.dropped,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "computeql_subscriptions_active",
			Help: "Open subscriptions in this process.",
		}, f.subscribers),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "computeql_feed_readers",
			Help: "Organizations whose event log this process follows (one reader each).",
		}, f.readers),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("feed metrics: %w", err)
		}
	}
	return nil
}

// subscribers counts the open subscriptions, when metrics are scraped rather than on every
// subscribe and leave, which may run twice for one subscription.
func (f *Feed) subscribers() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, of := range f.orgs {
		of.mu.Lock()
		n += of.n
		of.mu.Unlock()
	}
	return float64(n)
}

func (f *Feed) readers() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return float64(len(f.orgs))
}

// Wait returns once every reader has stopped (after the feed's context ended).
func (f *Feed) Wait() { f.wg.Wait() }

// orgFeed is one organization's reader and its subscribers.
type orgFeed struct {
	org  string
	mu   sync.Mutex
	last string // position of the last event fanned out
	// subs holds the subscriptions by the instance they watch, those to the whole
	// organization under "". An event is offered only to its instance's and the
	// organization's: with thousands of single-instance subscribers, matching every one
	// against every event was most of a busy API process's work.
	subs   map[string]map[*Subscription]struct{}
	n      int // subscriptions in subs
	cancel context.CancelFunc
}

// Subscription receives the events of one organization that match its filter.
type Subscription struct {
	// Start is the position the subscription goes live from: events after it are delivered.
	Start    string
	match    func(*instance.Record) bool
	instance string // the one instance it watches; "" for all
	// notify is told of every event buffered and of the end; nil tells nobody.
	notify func()
	max    int // the most events buffered at once

	mu sync.Mutex
	// buffered holds pointers: one event is shared by every subscriber. It is nil while
	// empty, so an idle subscriber holds no buffer at all.
	buffered []*instance.Record
	err      error
	closed   bool
	of       *orgFeed
	feed     *Feed
}

// Next returns the oldest buffered event; ok is false when none is buffered. Events are
// shared and must not be modified.
func (s *Subscription) Next() (r *instance.Record, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.buffered) == 0 {
		return nil, false
	}
	r, s.buffered[0] = s.buffered[0], nil
	if s.buffered = s.buffered[1:]; len(s.buffered) == 0 {
		s.buffered = nil
	}
	return r, true
}

// Buffered returns how many events wait in the buffer.
func (s *Subscription) Buffered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.buffered)
}

// Ended reports whether the subscription has ended and every event it buffered has been
// taken: nothing more will come (Err says why).
func (s *Subscription) Ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed && len(s.buffered) == 0
}

// Position returns how far the organization's reader has fanned out: every event up to it
// that the subscription matches is buffered already, or was taken. So once the buffer is
// found empty after Position was read, nothing the subscription matches lies before that
// position.
func (s *Subscription) Position() string {
	s.of.mu.Lock()
	defer s.of.mu.Unlock()
	return s.of.last
}

// Err says why the subscription ended: nil after Close, ErrSlowConsumer when it was cut off.
func (s *Subscription) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// SubscribeInstance starts a subscription to the events of one instance of the organization
// (of all of them when instanceID is empty) that match match: live from Start on. With after,
// it also returns the matching events after that position up to Start
// (instance.ErrCursorExpired when the log no longer reaches back to it); a caller that hands
// out the replay before the buffered events gets every event once, in the log's order. The
// reader offers an event only to the subscriptions of its instance and to the
// organization-wide ones, so a subscriber to one instance costs the other instances' events
// nothing. notify, when not nil, is called after each event is buffered and when the
// subscription ends; it runs in the organization's reader, holding its locks, so it must
// return at once and call nothing of the feed. The caller must Close the subscription.
func (f *Feed) SubscribeInstance(ctx context.Context, org, instanceID, after string, match func(*instance.Record) bool, notify func()) (*Subscription, []instance.Record, error) {
	s := &Subscription{match: match, instance: instanceID, notify: notify, max: f.opts.Buffer, feed: f}
	if err := f.join(ctx, org, s); err != nil {
		return nil, nil, err
	}
	if after == "" {
		return s, nil, nil
	}
	all, err := f.log.EventsBetween(ctx, org, after, s.Start)
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	replay := all[:0]
	// Live events reach only the subscriptions of their instance; the replay is filtered here.
	for _, r := range all {
		if (instanceID == "" || r.Instance.ID == instanceID) && match(&r) {
			replay = append(replay, r)
		}
	}
	return s, replay, nil
}

// join adds the subscription to the organization's feed, starting its reader for the first
// subscriber. The feed is looked up and the subscription added under the feed's lock, which
// the last subscriber's leave takes to stop the reader: a subscription is never added to a
// reader that is stopping.
func (f *Feed) join(ctx context.Context, org string, s *Subscription) error {
	for {
		f.mu.Lock()
		if of, ok := f.orgs[org]; ok {
			of.add(s)
			f.mu.Unlock()
			return nil
		}
		stops := f.stops
		f.mu.Unlock()
		// Read outside the lock, which every subscribe, leave and scrape of every organization
		// takes: a slow Redis must not stall them all. Two first subscribers may both read; the
		// first to come back starts the reader.
		last, err := f.log.LastEvent(ctx, org)
		if err != nil {
			return err
		}
		f.mu.Lock()
		of, ok := f.orgs[org]
		if !ok && f.stops != stops {
			// A reader stopped meanwhile, perhaps this organization's after fanning out events
			// later than last: starting from last would hand them out again.
			f.mu.Unlock()
			continue
		}
		if !ok {
			rctx, cancel := context.WithCancel(f.ctx)
			of = &orgFeed{org: org, last: last, subs: map[string]map[*Subscription]struct{}{}, cancel: cancel}
			f.orgs[org] = of
			f.wg.Go(func() { f.read(rctx, of) })
		}
		of.add(s)
		f.mu.Unlock()
		return nil
	}
}

// add puts the subscription among the feed's, live from the last event fanned out.
func (of *orgFeed) add(s *Subscription) {
	of.mu.Lock()
	defer of.mu.Unlock()
	s.of, s.Start = of, of.last
	if of.subs[s.instance] == nil {
		of.subs[s.instance] = map[*Subscription]struct{}{}
	}
	of.subs[s.instance][s] = struct{}{}
	of.n++
}

// read follows one organization's log. A failed read is retried from the last position fanned
// out, so a reader that loses Redis catches up without losing events.
func (f *Feed) read(ctx context.Context, of *orgFeed) {
	for ctx.Err() == nil {
		of.mu.Lock()
		after := of.last
		of.mu.Unlock()
		records, err := f.log.ReadEvents(ctx, of.org, after, f.opts.Block)
		if err != nil {
			if ctx.Err() == nil {
				f.opts.Logger.WarnContext(ctx, "feed: read events; retrying", "org", of.org, "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		var delivered, dropped int
		offer := func(r *instance.Record, subs map[*Subscription]struct{}) {
			for s := range subs {
				if s.match(r) {
					switch s.deliver(r) {
					case deliveredOK:
						delivered++
					case deliveredDropped:
						dropped++
					}
				}
			}
		}
		of.mu.Lock()
		for i := range records {
			r := &records[i]
			offer(r, of.subs[""])
			if id := r.Instance.ID; id != "" {
				offer(r, of.subs[id])
			}
			of.last = r.Cursor
		}
		of.mu.Unlock()
		// Counted once per batch: with thousands of subscribers, once per delivery would cost
		// the fan-out an atomic add each.
		f.delivered.Add(float64(delivered))
		f.dropped.Add(float64(dropped))
	}
}

// What became of one delivery.
type delivery int

const (
	deliveredOK delivery = iota
	deliveredDropped
	deliveredClosed // the subscription had ended: nothing was lost
)

// deliver hands a live event over without ever blocking the reader: a full buffer ends the
// subscription instead.
func (s *Subscription) deliver(r *instance.Record) delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return deliveredClosed
	}
	if len(s.buffered) >= s.max {
		s.failLocked(ErrSlowConsumer)
		return deliveredDropped
	}
	s.buffered = append(s.buffered, r)
	if s.notify != nil {
		s.notify()
	}
	return deliveredOK
}

func (s *Subscription) failLocked(err error) {
	if s.closed {
		return
	}
	s.err, s.closed = err, true
	if s.notify != nil {
		s.notify()
	}
	go s.leave() // the reader holds the org lock; leave takes it
}

// Close ends the subscription.
func (s *Subscription) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.leave()
}

// leave removes the subscription from its organization's feed, stopping the reader with the
// last subscriber.
func (s *Subscription) leave() {
	f, of := s.feed, s.of
	f.mu.Lock()
	defer f.mu.Unlock()
	of.mu.Lock()
	if _, ok := of.subs[s.instance][s]; ok {
		delete(of.subs[s.instance], s)
		of.n--
		if len(of.subs[s.instance]) == 0 {
			delete(of.subs, s.instance)
		}
	}
	empty := of.n == 0
	of.mu.Unlock()
	if empty && f.orgs[of.org] == of {
		delete(f.orgs, of.org)
		f.stops++
		of.cancel()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
