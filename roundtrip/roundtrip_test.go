package roundtrip

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
)

const waitLimit = 10 * time.Second

// trips records what a Shared ran: each lone item, each shared run's items, and the most round
// trips under way at once. A lone run holds until open is closed when gated, and tells entered.
type trips struct {
	gated   bool
	open    chan struct{}
	entered chan int

	mu          sync.Mutex
	alone       []int
	together    [][]int
	now, most   int
	sharedCtxOK bool
}

func newTrips(gated bool) *trips {
	return &trips{gated: gated, open: make(chan struct{}), entered: make(chan int, 100), sharedCtxOK: true}
}

func (tr *trips) begin() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.now++
	tr.most = max(tr.most, tr.now)
}

func (tr *trips) end() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.now--
}

func (tr *trips) share(most int) *Shared[*int] {
	return Share(most,
		func(ctx context.Context, item *int) {
			tr.begin()
			defer tr.end()
			if tr.gated {
				tr.entered <- *item
				<-tr.open
			}
			tr.mu.Lock()
			tr.alone = append(tr.alone, *item)
			tr.mu.Unlock()
			*item = -*item // the outcome, for the caller to read
		},
		func(ctx context.Context, items []*int) {
			tr.begin()
			defer tr.end()
			var got []int
			for _, item := range items {
				got = append(got, *item)
				*item = -*item
			}
			tr.mu.Lock()
			tr.together = append(tr.together, got)
			if _, ok := ctx.Deadline(); !ok || ctx.Err() != nil {
				tr.sharedCtxOK = false
			}
			tr.mu.Unlock()
		})
}

// TestAloneUpToTheMostThenShared: the first callers each make a round trip of their own; those
// that come while the most are under way wait, and go together in one shared round trip, in
// the order they came, as soon as one ends; every caller reads its own outcome; never more than
// the most are under way.
func TestAloneUpToTheMostThenShared(t *testing.T) {
	const most, more = 3, 10
	tr := newTrips(true)
	s := tr.share(most)
	var wg sync.WaitGroup
	do := func(n int) {
		wg.Go(func() {
			item := n
			if err := s.Do(context.Background(), &item); err != nil {
				t.Errorf("item %d: %v", n, err)
			}
			if item != -n {
				t.Errorf("item %d reads %d after Do, want its outcome %d", n, item, -n)
			}
		})
	}
	for n := 1; n <= most; n++ {
		do(n)
	}
	for range most {
		select {
		case <-tr.entered:
		case <-time.After(waitLimit):
			t.Fatal("the first callers did not each make a round trip")
		}
	}
	var want []int
	for n := most + 1; n <= most+more; n++ {
		do(n)
		want = append(want, n)
		eventually.Holds(t, waitLimit, func() bool { return s.Waiting() == len(want) }, "the caller waiting")
	}
	close(tr.open)
	wg.Wait()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.alone) != most {
		t.Errorf("%d items went alone, want %d", len(tr.alone), most)
	}
	if len(tr.together) != 1 || !slices.Equal(tr.together[0], want) {
		t.Errorf("shared round trips %v, want one of %v", tr.together, want)
	}
	if tr.most != most {
		t.Errorf("at most %d round trips were under way at once, want %d", tr.most, most)
	}
	if !tr.sharedCtxOK {
		t.Errorf("a shared round trip's context had no deadline, or had ended")
	}
	if n := s.Waiting(); n != 0 {
		t.Errorf("%d items still waiting", n)
	}
}

// TestLoneCallersGoAlone: callers one after another never wait: each makes its own round trip.
func TestLoneCallersGoAlone(t *testing.T) {
	tr := newTrips(false)
	s := tr.share(1)
	for n := 1; n <= 5; n++ {
		item := n
		if err := s.Do(context.Background(), &item); err != nil || item != -n {
			t.Fatalf("item %d: %v, reads %d", n, err, item)
		}
	}
	if !slices.Equal(tr.alone, []int{1, 2, 3, 4, 5}) || len(tr.together) != 0 {
		t.Errorf("alone %v, together %v; want every item alone", tr.alone, tr.together)
	}
}

// TestWaitingCallerLeavesWithItsContext: a waiting caller whose context ends returns its error
// at once; the shared round trip it was to join still runs, for the others, under a context of
// its own that the caller's end does not touch.
func TestWaitingCallerLeavesWithItsContext(t *testing.T) {
	tr := newTrips(true)
	s := tr.share(1)
	var wg sync.WaitGroup
	wg.Go(func() {
		item := 1
		if err := s.Do(context.Background(), &item); err != nil {
			t.Error(err)
		}
	})
	<-tr.entered
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		item := 2
		left <- s.Do(ctx, &item)
	}()
	eventually.Holds(t, waitLimit, func() bool { return s.Waiting() == 1 }, "the caller waiting")
	wg.Go(func() {
		item := 3
		if err := s.Do(context.Background(), &item); err != nil || item != -3 {
			t.Errorf("the caller that stayed: %v, reads %d", err, item)
		}
	})
	eventually.Holds(t, waitLimit, func() bool { return s.Waiting() == 2 }, "both callers waiting")
	cancel()
	select {
	case err := <-left:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the caller whose context ended got %v, want context.Canceled", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("the caller whose context ended is still waiting")
	}
	close(tr.open)
	wg.Wait()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.together) != 1 || !slices.Equal(tr.together[0], []int{2, 3}) || !tr.sharedCtxOK {
		t.Errorf("shared round trips %v (context fine: %t), want one of [2 3] under a live context", tr.together, tr.sharedCtxOK)
	}
}

// TestEndedContextRunsNothing: a caller whose context has already ended runs nothing.
func TestEndedContextRunsNothing(t *testing.T) {
	tr := newTrips(false)
	s := tr.share(1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	item := 1
	if err := s.Do(ctx, &item); !errors.Is(err, context.Canceled) {
		t.Errorf("Do on an ended context: %v, want context.Canceled", err)
	}
	if len(tr.alone)+len(tr.together) != 0 || item != 1 {
		t.Errorf("an ended context ran its item: alone %v, together %v", tr.alone, tr.together)
	}
}

// TestManyCallers: many concurrent callers (run with -race) each run exactly once, never more
// than the most round trips at once, and all round trips end with the callers.
func TestManyCallers(t *testing.T) {
	const most, callers = 4, 400
	tr := newTrips(false)
	s := tr.share(most)
	var wg sync.WaitGroup
	for n := 1; n <= callers; n++ {
		wg.Go(func() {
			item := n
			if err := s.Do(context.Background(), &item); err != nil || item != -n {
				t.Errorf("item %d: %v, reads %d", n, err, item)
			}
		})
	}
	wg.Wait()
	// The last shared round trip may still be giving its slot back.
	eventually.Holds(t, waitLimit, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.under == 0
	}, "every round trip ended")
	tr.mu.Lock()
	defer tr.mu.Unlock()
	ran := slices.Clone(tr.alone)
	for _, items := range tr.together {
		ran = append(ran, items...)
	}
	slices.Sort(ran)
	want := make([]int, callers)
	for i := range want {
		want[i] = i + 1
	}
	if !slices.Equal(ran, want) {
		t.Errorf("%d runs for %d callers: not each caller's item exactly once", len(ran), callers)
	}
	if tr.most > most {
		t.Errorf("%d round trips under way at once, want at most %d", tr.most, most)
	}
}
