package server

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"github.com/99designs/gqlgen/graphql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
)

// Which limit refused a connection or a subscription, the label of the refusals counter.
const (
	limitProcessSockets         = "process_sockets"
	limitPrincipalSockets       = "principal_sockets"
	limitSocketSubscriptions    = "socket_subscriptions"
	limitPrincipalSubscriptions = "principal_subscriptions"
	limitProcessConsoles        = "process_consoles"
	limitPrincipalConsoles      = "principal_consoles"
)

// connLimits bounds what stays open: sockets and consoles in this process, sockets,
// subscriptions and consoles of one principal (a token's subject), subscriptions on one socket. Rate limits count requests; these
// count what a caller holds, each of which costs memory and goroutines for as long as it lasts.
type connLimits struct {
	maxSockets, maxPrincipalSockets, maxSocketSubs, maxPrincipalSubs int
	maxConsoles, maxPrincipalConsoles                                int

	mu       sync.Mutex
	sockets  int
	consoles int
	held     map[string]*principalHolds // by subject; removed when it holds nothing
	refused  *prometheus.CounterVec
}

type principalHolds struct{ sockets, subscriptions, consoles int }

func newConnLimits(o Options, reg prometheus.Registerer) (*connLimits, error) {
	l := &connLimits{
		maxSockets: o.MaxSockets, maxPrincipalSockets: o.MaxSocketsPerPrincipal,
		maxSocketSubs: o.MaxSubscriptionsPerSocket, maxPrincipalSubs: o.MaxSubscriptionsPerPrincipal,
		maxConsoles: o.MaxConsoles, maxPrincipalConsoles: o.MaxConsolesPerPrincipal,
		held: map[string]*principalHolds{},
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "computeql_connection_limit_refusals_total",
			Help: "Sockets and subscriptions refused by a connection limit, by the limit.",
		}, []string{"limit"}),
	}
	for _, v := range []string{limitProcessSockets, limitPrincipalSockets, limitSocketSubscriptions, limitPrincipalSubscriptions, limitProcessConsoles, limitPrincipalConsoles} {
		l.refused.WithLabelValues(v)
	}
	if err := reg.Register(l.refused); err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	return l, nil
}

// takeSocket holds one of the process's sockets, or reports that none is left.
func (l *connLimits) takeSocket() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sockets >= l.maxSockets {
		l.refused.WithLabelValues(limitProcessSockets).Inc()
		return false
	}
	l.sockets++
	return true
}

func (l *connLimits) releaseSocket() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sockets--
}

// take holds one more socket, subscription or console of the subject, within max; it returns
// the hold, or nil when the subject holds max already.
func (l *connLimits) take(subject string, count func(*principalHolds) *int, max int, limit string) *hold {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.held[subject]
	if h == nil {
		h = &principalHolds{}
		l.held[subject] = h
	}
	if *count(h) >= max {
		l.refused.WithLabelValues(limit).Inc()
		if *h == (principalHolds{}) {
			delete(l.held, subject)
		}
		return nil
	}
	*count(h)++
	return &hold{l: l, holds: h, count: count, subject: subject}
}

// hold is one socket, subscription or console a principal holds, until released. A struct
// rather than a sync.OnceFunc closure: an idle subscriber keeps two, and a OnceFunc costs
// several allocations.
type hold struct {
	l        *connLimits
	holds    *principalHolds
	count    func(*principalHolds) *int
	subject  string
	released bool // guarded by l.mu
}

// release gives the hold back; only the first call does anything.
func (h *hold) release() {
	l := h.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if h.released {
		return
	}
	h.released = true
	*h.count(h.holds)--
	if *h.holds == (principalHolds{}) && l.held[h.subject] == h.holds {
		delete(l.held, h.subject)
	}
}

func socketsOf(h *principalHolds) *int       { return &h.sockets }
func subscriptionsOf(h *principalHolds) *int { return &h.subscriptions }
func consolesOf(h *principalHolds) *int      { return &h.consoles }

// takeConsole holds one of the process's consoles and one of the subject's; it returns the
// function that gives both back (once), or nil and why it refused.
func (l *connLimits) takeConsole(subject string) (func(), string) {
	l.mu.Lock()
	if l.consoles >= l.maxConsoles {
		l.mu.Unlock()
		l.refused.WithLabelValues(limitProcessConsoles).Inc()
		return nil, fmt.Sprintf("this server has as many consoles open as it may (%d); retry later", l.maxConsoles)
	}
	l.consoles++
	l.mu.Unlock()
	held := l.take(subject, consolesOf, l.maxPrincipalConsoles, limitPrincipalConsoles)
	if held == nil {
		l.releaseConsole()
		return nil, fmt.Sprintf("%s has as many consoles open as one principal may (%d): close one first", subject, l.maxPrincipalConsoles)
	}
	return sync.OnceFunc(func() {
		held.release()
		l.releaseConsole()
	}), ""
}

func (l *connLimits) releaseConsole() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.consoles--
}

// refuseSocket answers a WebSocket handshake past the process's sockets with 429 and
// Retry-After.
func (l *connLimits) refuseSocket(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Retry-After", "5")
	writeError(w, r, http.StatusTooManyRequests, instance.CodeRateLimited,
		fmt.Sprintf("this server holds as many WebSockets as it may (%d); retry later, or use another", l.maxSockets))
}

// socketSubscriptions counts the subscriptions open on one socket.
type socketSubscriptions struct {
	mu sync.Mutex
	n  int
}

func (s *socketSubscriptions) leave() {
	s.mu.Lock()
	s.n--
	s.mu.Unlock()
}

// subscriptionLimit is the operation interceptor that holds a subscription's place on its
// socket and of its principal for as long as it runs, refusing one over either limit.
type subscriptionLimit struct{ limits *connLimits }

var (
	_ graphql.HandlerExtension     = subscriptionLimit{}
	_ graphql.OperationInterceptor = subscriptionLimit{}
)

func (subscriptionLimit) ExtensionName() string                   { return "SubscriptionLimit" }
func (subscriptionLimit) Validate(graphql.ExecutableSchema) error { return nil }

func (s subscriptionLimit) InterceptOperation(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
	oc := graphql.GetOperationContext(ctx)
	if oc.Operation == nil || oc.Operation.Operation != ast.Subscription {
		return next(ctx)
	}
	l := s.limits
	var sock *socketSubscriptions // nil: not on a WebSocket
	if op, ok := ctx.Value(wsOpKey{}).(*wsOp); ok {
		sock = &op.c.subscriptions
		sock.mu.Lock()
		full := sock.n >= l.maxSocketSubs
		if !full {
			sock.n++
		}
		sock.mu.Unlock()
		if full {
			l.refused.WithLabelValues(limitSocketSubscriptions).Inc()
			return refusal(instance.CodeRateLimited, fmt.Sprintf("this connection holds as many subscriptions as one may (%d): stop one first", l.maxSocketSubs))
		}
	}
	var held *hold
	if p, ok := auth.FromContext(ctx); ok {
		if held = l.take(p.Subject, subscriptionsOf, l.maxPrincipalSubs, limitPrincipalSubscriptions); held == nil {
			if sock != nil {
				sock.leave()
			}
			return refusal(instance.CodeRateLimited, fmt.Sprintf("%s holds as many subscriptions as one principal may (%d): stop one first", p.Subject, l.maxPrincipalSubs))
		}
	}
	// One callback gives back both places when the subscription ends, however it ends (each
	// costs every idle subscription its bytes).
	whenEnded(ctx, func() {
		if sock != nil {
			sock.leave()
		}
		if held != nil {
			held.release()
		}
	})
	return next(ctx)
}

// refusal answers an operation refused before it ran with one error of the code.
func refusal(code instance.Code, msg string) graphql.ResponseHandler {
	return graphql.OneShot(&graphql.Response{Errors: gqlerror.List{{
		Message:    msg,
		Extensions: map[string]any{"code": string(code)},
	}}})
}
