package sim

import (
	"context"
	"fmt"
	"testing"

	"github.com/computeql/computeql/region"
)

// TestWatchStopsWithItsContext: a watch whose context ends mid-batch hands over no more of
// the batch and returns nil, rather than calling fn with a context every call would fail on.
func TestWatchStopsWithItsContext(t *testing.T) {
	e := newEnv(t)
	s := e.sim(Options{})
	for i := range 5 {
		if _, err := s.CreateServer(context.Background(), spec(t, "net-acme-web-eu", "w", fmt.Sprintf("i-%d", i))); err != nil {
			t.Fatalf("CreateServer: %v", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	err := s.Watch(ctx, "0-0", func(region.Event) error {
		calls++
		cancel() // the five events came in one read; this is the first of them
		return nil
	})
	if err != nil || calls != 1 {
		t.Errorf("Watch returned %v after %d calls, want nil after 1", err, calls)
	}
}
