package server

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/gorilla/websocket"
	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
)

// rateLimitPrincipals bounds the principals whose buckets are kept, some 150 bytes each (15 MB
// at most). A principal pushed out as the least recently seen comes back to a full bucket,
// which takes 100,000 other authenticated principals seen in between.
const rateLimitPrincipals = 100_000

// rateLimiter is a token bucket per key: a bucket holds up to burst tokens and gains rate
// tokens per second, and every request takes one or is refused. A bucket is kept as the one
// instant at which it is full again (the generic cell rate algorithm's "theoretical arrival
// time"): taking a token pushes that instant one interval (1/rate) later, and a bucket may
// take one only while the instant stays within burst intervals of now. A bucket whose instant
// has passed is full, the same as no bucket at all, so it can be forgotten at no cost.
//
// One mutex guards the table: the critical section is a map lookup, a list move and a few
// integer operations, which BenchmarkRateLimiter measures under contention.
type rateLimiter struct {
	interval time.Duration // between two tokens
	capacity time.Duration // burst intervals: how far ahead of now a bucket's full instant may be
	epoch    time.Time     // instants are offsets from it, so a bucket is one integer
	now      func() time.Time

	mu      sync.Mutex
	buckets *simplelru.LRU[string, *bucket]
}

type bucket struct {
	full time.Duration // since epoch: when the bucket holds burst tokens again
}

// newRateLimiter returns a limiter of rate tokens per second with bursts of burst, keeping at
// most size buckets, on the clock now.
func newRateLimiter(rate float64, burst, size int, now func() time.Time) (*rateLimiter, error) {
	if !(rate > 0) || math.IsInf(rate, 0) || burst < 1 {
		return nil, fmt.Errorf("rate limiter: want a finite rate > 0 and a burst >= 1, have %v and %d", rate, burst)
	}
	interval := float64(time.Second) / rate
	// Offsets from the epoch must still fit an int64 with capacity added, for centuries of uptime.
	if interval*float64(burst) > math.MaxInt64/2 {
		return nil, fmt.Errorf("rate limiter: a rate of %v per second with bursts of %d spans more than a century", rate, burst)
	}
	buckets, err := simplelru.NewLRU[string, *bucket](size, nil)
	if err != nil {
		return nil, fmt.Errorf("rate limiter: %w", err)
	}
	return &rateLimiter{
		interval: time.Duration(interval),
		capacity: time.Duration(interval * float64(burst)),
		epoch:    now(),
		now:      now,
		buckets:  buckets,
	}, nil
}

// allow takes a token from key's bucket. When the bucket is empty it takes nothing and returns
// false with how long until a token is there.
func (l *rateLimiter) allow(key string) (time.Duration, bool) { return l.allowN(key, 1) }

// allowN takes n tokens from key's bucket at once, or none, returning how long until there
// are n; n must be at most the burst.
func (l *rateLimiter) allowN(key string, n int) (time.Duration, bool) {
	now := l.now().Sub(l.epoch)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forgetFull(now)
	b, ok := l.buckets.Get(key)
	if !ok {
		b = &bucket{}
		l.buckets.Add(key, b)
	}
	full := max(b.full, now) + time.Duration(n)*l.interval
	if ahead := full - now; ahead > l.capacity {
		return ahead - l.capacity, false
	}
	b.full = full
	return 0, true
}

// forgetFull drops up to two full buckets from the least recently used end, so that the table
// shrinks back as principals go quiet, faster than a call can grow it. l.mu must be held.
func (l *rateLimiter) forgetFull(now time.Duration) {
	for range 2 {
		_, b, ok := l.buckets.GetOldest()
		if !ok || b.full > now {
			return
		}
		l.buckets.RemoveOldest()
	}
}

// available is how many tokens key's bucket holds now, of burst, taking none.
func (l *rateLimiter) available(key string, burst int) int {
	now := l.now().Sub(l.epoch)
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets.Peek(key)
	if !ok || b.full <= now {
		return burst
	}
	return max(0, int((l.capacity-(b.full-now))/l.interval))
}

// len is the number of buckets kept.
func (l *rateLimiter) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buckets.Len()
}

// rateLimit enforces a per-principal rateLimiter on every transport: as HTTP middleware,
// where each request counts once after authentication, and as a gqlgen extension, where each
// operation on a WebSocket counts once. Operations of an HTTP request, which the middleware
// has counted, pass the extension without counting again.
//
// An operation counts once per top-level field, as GitHub's API counts points: each reads the
// store on its own, so one request of 190 aliases costs what 190 requests do. The request
// (or the socket operation) took one token; the fields after the first take the rest when the
// operation has been parsed, before any of it runs.
type rateLimit struct {
	limiter   *rateLimiter
	burst     int
	perSecond float64
	rate      string // for the message, e.g. "50 requests per second with bursts of 100"
	refused   prometheus.Counter
}

var _ interface {
	graphql.HandlerExtension
	graphql.OperationParameterMutator
	graphql.OperationContextMutator
} = (*rateLimit)(nil)

func newRateLimit(rate float64, burst int, now func() time.Time, reg prometheus.Registerer) (*rateLimit, error) {
	l, err := newRateLimiter(rate, burst, rateLimitPrincipals, now)
	if err != nil {
		return nil, err
	}
	refused := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "computeql_rate_limited_total",
		Help: "Requests and WebSocket operations refused because their principal exceeded its rate limit.",
	})
	if err := reg.Register(refused); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return &rateLimit{
		limiter:   l,
		burst:     burst,
		perSecond: rate,
		rate:      strconv.FormatFloat(rate, 'g', -1, 64) + " requests per second with bursts of " + strconv.Itoa(burst),
		refused:   refused,
	}, nil
}

// check counts one request of the principal. Over the limit, it returns the error to answer
// with and the seconds to wait; otherwise nil.
func (rl *rateLimit) check(p auth.Principal) (*gqlerror.Error, int) { return rl.checkN(p, 1) }

// checkN counts n requests of the principal at once, or none; n is at most the burst.
func (rl *rateLimit) checkN(p auth.Principal, n int) (*gqlerror.Error, int) {
	wait, ok := rl.limiter.allowN(p.Subject, n)
	if ok {
		return nil, 0
	}
	rl.refused.Inc()
	secs := retryAfterSeconds(wait)
	return &gqlerror.Error{
		Message: fmt.Sprintf("rate limit exceeded (%s); retry in %d s", rl.rate, secs),
		Extensions: map[string]any{
			"code":       string(instance.CodeRateLimited),
			"retryAfter": secs,
		},
	}, secs
}

// MutateOperationContext counts the operation's top-level fields after its first, which the
// request already counted. One of more fields than the burst could never run, and is refused
// without a time to retry.
func (rl *rateLimit) MutateOperationContext(ctx context.Context, opCtx *graphql.OperationContext) *gqlerror.Error {
	p, ok := auth.FromContext(ctx)
	if !ok || opCtx.Operation == nil {
		return nil
	}
	n := topLevelFields(opCtx.Doc, opCtx.Operation.SelectionSet)
	switch {
	case n <= 1:
		return nil
	case n > rl.burst:
		rl.refused.Inc()
		return &gqlerror.Error{
			Message:    fmt.Sprintf("an operation of %d top-level fields counts as %d requests, more than the rate limit allows at once (%s)", n, n, rl.rate),
			Extensions: map[string]any{"code": string(instance.CodeRateLimited)},
		}
	}
	gerr, _ := rl.checkN(p, n-1)
	if gerr != nil {
		gerr.Message = fmt.Sprintf("an operation of %d top-level fields counts as %d requests: %s", n, n, gerr.Message)
	}
	return gerr
}

// topLevelFields counts the fields of a selection set, fragments expanded, __typename aside.
func topLevelFields(doc *ast.QueryDocument, set ast.SelectionSet) int {
	n := 0
	for _, sel := range set {
		switch sel := sel.(type) {
		case *ast.Field:
			if sel.Name != "__typename" {
				n++
			}
		case *ast.InlineFragment:
			n += topLevelFields(doc, sel.SelectionSet)
		case *ast.FragmentSpread:
			if f := doc.Fragments.ForName(sel.Name); f != nil {
				n += topLevelFields(doc, f.SelectionSet)
			}
		}
	}
	return n
}

// retryAfterSeconds is a wait in whole seconds, rounded up and at least 1, as Retry-After
// wants it: a client that retries at once after "0" would only be refused again.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}

// middleware counts every authenticated HTTP request once, refusing one over the limit with
// 429 and Retry-After. A WebSocket handshake is not a request here: its operations are counted
// one by one by the extension.
func (rl *rateLimit) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := auth.FromContext(r.Context())
		if !ok || websocket.IsWebSocketUpgrade(r) {
			next.ServeHTTP(w, r)
			return
		}
		if gerr, secs := rl.check(p); gerr != nil {
			w.Header().Set("Retry-After", strconv.Itoa(secs))
			writeErrors(w, r, http.StatusTooManyRequests, gqlerror.List{gerr})
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (*rateLimit) ExtensionName() string                   { return "RateLimit" }
func (*rateLimit) Validate(graphql.ExecutableSchema) error { return nil }

// MutateOperationParameters counts a WebSocket operation. It runs before the operation is
// parsed, so a refused one costs no parsing or validation, as a refused HTTP request; the
// transport answers it with a result carrying the error, and the socket stays open.
func (rl *rateLimit) MutateOperationParameters(ctx context.Context, _ *graphql.RawParams) *gqlerror.Error {
	if !onSocket(ctx) {
		return nil
	}
	p, ok := auth.FromContext(ctx)
	if !ok {
		return nil // a socket runs operations only once connection_init has authenticated it
	}
	gerr, _ := rl.check(p)
	return gerr
}
