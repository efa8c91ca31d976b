package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestClosedLoop(t *testing.T) {
	tests := []struct {
		name        string
		clients, n  int
		failEvery   int // request i fails when i%failEvery == 0 (0: none)
		wantErrors  int
		wantFirstOK bool
	}{
		{name: "n requests from several clients", clients: 4, n: 100},
		{name: "one client", clients: 1, n: 7},
		{name: "more clients than requests", clients: 64, n: 3},
		{name: "failures are counted, the first kept", clients: 4, n: 100, failEvery: 10, wantErrors: 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			sent := map[int]int{}
			l := closedLoop(context.Background(), tt.clients, tt.n, 0, func(_ context.Context, i int) error {
				mu.Lock()
				sent[i]++
				mu.Unlock()
				if tt.failEvery > 0 && i%tt.failEvery == 0 {
					return fmt.Errorf("request %d refused", i)
				}
				return nil
			})
			if len(sent) != tt.n {
				t.Errorf("sent %d distinct requests, want %d", len(sent), tt.n)
			}
			for i, c := range sent {
				if c != 1 || i < 0 || i >= tt.n {
					t.Errorf("request %d sent %d times", i, c)
				}
			}
			if l.Requests != tt.n || l.Errors != tt.wantErrors || l.Latency.Count != tt.n || l.Concurrency != tt.clients {
				t.Errorf("load = %+v", l)
			}
			if (l.FirstError != "") != (tt.wantErrors > 0) {
				t.Errorf("first error %q with %d errors", l.FirstError, tt.wantErrors)
			}
		})
	}
}

// A run bounded by time ends when its context does, whatever its length.
func TestClosedLoopStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	l := closedLoop(ctx, 2, 0, time.Hour, func(ctx context.Context, i int) error {
		if i == 10 {
			cancel()
		}
		return nil
	})
	if l.Requests < 11 {
		t.Errorf("only %d requests before the cancel", l.Requests)
	}
}

func TestOpenLoop(t *testing.T) {
	var mu sync.Mutex
	sent := map[int]bool{}
	l := openLoop(context.Background(), 1000, 50*time.Millisecond, 8, func(_ context.Context, i int) error {
		mu.Lock()
		defer mu.Unlock()
		sent[i] = true
		if i == 3 {
			return errors.New("refused")
		}
		return nil
	})
	if len(sent) != 50 || l.Requests != 50 {
		t.Errorf("sent %d, counted %d requests; want rate × duration = 50", len(sent), l.Requests)
	}
	if l.Errors != 1 || l.FirstError != "refused" || l.OfferedRate != 1000 {
		t.Errorf("load = %+v", l)
	}
}
