package server

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// inflight is a Redis hook that records the most calls in flight at once. Each call is made
// to take a millisecond longer, as on a busy Redis, so that calls that may overlap do.
type inflight struct {
	mu       sync.Mutex
	now, max int
}

// counted marks a call counted, so that the calls it makes itself (a new connection's
// handshake) are not counted again.
type counted struct{}

// enter counts a call, unless it runs inside one counted already.
func (h *inflight) enter(ctx context.Context) (context.Context, func()) {
	if ctx.Value(counted{}) != nil {
		return ctx, func() {}
	}
	h.mu.Lock()
	h.now++
	h.max = max(h.max, h.now)
	h.mu.Unlock()
	time.Sleep(time.Millisecond)
	return context.WithValue(ctx, counted{}, true), func() { h.mu.Lock(); h.now--; h.mu.Unlock() }
}

func (h *inflight) peak() int { h.mu.Lock(); defer h.mu.Unlock(); return h.max }

func (h *inflight) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *inflight) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		ctx, leave := h.enter(ctx)
		defer leave()
		return next(ctx, cmd)
	}
}
func (h *inflight) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		ctx, leave := h.enter(ctx)
		defer leave()
		return next(ctx, cmds)
	}
}

// TestOneRequestHoldsABoundedShareOfTheStore: a request of 60 history aliases, each listing
// events whose large fields are read from the store, runs at most MaxStoreCallsPerRequest
// store calls at once, and answers in full.
func TestOneRequestHoldsABoundedShareOfTheStore(t *testing.T) {
	for _, limit := range []int{1, 3} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			a := newAPI(t, func(o *Options) { o.MaxStoreCallsPerRequest, o.MaxComplexity = limit, 100_000 })
			tok := a.admin(t)
			id := a.mustCreate(t, tok, createInput("bounded")).ID
			a.describe(t, tok, id, "one")
			h := &inflight{}
			a.rdb.AddHook(h)
			var q strings.Builder
			q.WriteString("query($id: ID!) {")
			for i := range 60 {
				fmt.Fprintf(&q, " h%d: instanceEvents(id: $id) { edges { node { kind instance { description tags { name } } } } }", i)
			}
			q.WriteString(" }")
			res := a.mustPost(t, tok, q.String(), map[string]any{"id": id})
			if len(res.Data) != 60 {
				t.Fatalf("%d aliases answered, want 60", len(res.Data))
			}
			if got := h.peak(); got > limit {
				t.Errorf("%d store calls at once, want at most %d", got, limit)
			}
		})
	}
}
