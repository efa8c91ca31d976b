package store

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// LimitCalls returns a context under which at most n calls to Redis (a command, a script or
// a pipeline) of the store run at once; the rest wait their turn, or for ctx to end. The API
// gives each request one: gqlgen resolves a query's root fields, and the fields of each item
// of a list, concurrently, so that without a limit one request of 200 aliases would hold 200
// connections of the pool at once and every other caller would wait for it.
func LimitCalls(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, callSlotsKey{}, make(chan struct{}, n))
}

type (
	callSlotsKey struct{}
	// slotHeldKey marks a call that holds a slot, so that what it runs itself through the
	// hooks (a new connection's handshake) does not wait for another.
	slotHeldKey struct{}
)

// CallLimitHook is the go-redis hook that applies LimitCalls. A process adds it once to the
// client it makes: the hooks of a client are never removed, and each added runs on every call.
type CallLimitHook struct{}

func (CallLimitHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (CallLimitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		ctx, release, err := takeSlot(ctx)
		if err != nil {
			cmd.SetErr(err)
			return err
		}
		defer release()
		return next(ctx, cmd)
	}
}

func (CallLimitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		ctx, release, err := takeSlot(ctx)
		if err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		defer release()
		return next(ctx, cmds)
	}
}

// takeSlot waits for a slot of the context's limit, if it has one.
func takeSlot(ctx context.Context) (context.Context, func(), error) {
	slots, _ := ctx.Value(callSlotsKey{}).(chan struct{})
	if slots == nil || ctx.Value(slotHeldKey{}) != nil {
		return ctx, func() {}, nil
	}
	select {
	case slots <- struct{}{}:
		return context.WithValue(ctx, slotHeldKey{}, true), func() { <-slots }, nil
	case <-ctx.Done():
		return ctx, nil, context.Cause(ctx)
	}
}
