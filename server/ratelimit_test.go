package server

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/metrictest"
)

// testClock is a clock that moves only when the test says.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestRateLimiterBuckets: a bucket starts full, gives burst tokens at once, refills at rate up
// to burst and no further, says how long until the next token, and is one per key.
func TestRateLimiterBuckets(t *testing.T) {
	type step struct {
		advance time.Duration // before the call
		key     string
		ok      bool
		wait    time.Duration // when refused
	}
	ok := func(key string) step { return step{key: key, ok: true} }
	tests := []struct {
		name  string
		rate  float64
		burst int
		steps []step
	}{
		{"burst then refused", 1, 3, []step{ok("a"), ok("a"), ok("a"), {key: "a", wait: time.Second}}},
		{"keys are independent", 1, 1, []step{ok("a"), {key: "a", wait: time.Second}, ok("b"), {key: "b", wait: time.Second}}},
		{"refills at rate", 1, 3, []step{
			ok("a"), ok("a"), ok("a"),
			{advance: 400 * time.Millisecond, key: "a", wait: 600 * time.Millisecond},
			{advance: 600 * time.Millisecond, key: "a", ok: true},
			{key: "a", wait: time.Second},
		}},
		{"refills up to burst only", 1, 3, []step{
			ok("a"), {advance: time.Hour, key: "a", ok: true}, ok("a"), ok("a"), {key: "a", wait: time.Second},
		}},
		{"refused calls take nothing", 2, 1, []step{
			ok("a"), {key: "a", wait: 500 * time.Millisecond}, {key: "a", wait: 500 * time.Millisecond},
			{advance: 500 * time.Millisecond, key: "a", ok: true},
		}},
		{"fractional rate", 0.4, 1, []step{ok("a"), {key: "a", wait: 2500 * time.Millisecond}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newTestClock()
			l, err := newRateLimiter(tt.rate, tt.burst, 100, clock.now)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				clock.advance(s.advance)
				wait, ok := l.allow(s.key)
				if ok != s.ok || wait != s.wait {
					t.Fatalf("step %d (%s): allow = %v, %v; want %v, %v", i, s.key, wait, ok, s.wait, s.ok)
				}
			}
		})
	}
}

// TestRateLimiterMemoryIsBounded: more principals than the bound keep the table at the bound,
// and buckets that have filled up again are forgotten as later calls come.
func TestRateLimiterMemoryIsBounded(t *testing.T) {
	const bound = 8
	clock := newTestClock()
	l, err := newRateLimiter(1, 3, bound, clock.now)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10_000 {
		l.allow(strconv.Itoa(i))
		if n := l.len(); n > bound {
			t.Fatalf("%d buckets after %d principals, bound %d", n, i+1, bound)
		}
	}
	if n := l.len(); n != bound {
		t.Fatalf("%d buckets, want the bound %d", n, bound)
	}
	// An hour later every bucket is full; one principal's calls sweep the others away.
	clock.advance(time.Hour)
	for range bound {
		l.allow("active")
	}
	if n := l.len(); n != 1 {
		t.Errorf("%d buckets once all but one are full again, want 1", n)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	tests := []struct {
		wait time.Duration
		want int
	}{
		{0, 1},
		{time.Nanosecond, 1},
		{20 * time.Millisecond, 1},
		{time.Second, 1},
		{time.Second + time.Nanosecond, 2},
		{2500 * time.Millisecond, 3},
		{time.Minute, 60},
	}
	for _, tt := range tests {
		if got := retryAfterSeconds(tt.wait); got != tt.want {
			t.Errorf("retryAfterSeconds(%v) = %d, want %d", tt.wait, got, tt.want)
		}
	}
}

// TestRateLimitSettingsAreValidated: settings the limiter cannot honour fail New.
func TestRateLimitSettingsAreValidated(t *testing.T) {
	var opts Options
	newAPI(t, func(o *Options) { opts = *o })
	tests := []struct {
		name  string
		rate  float64
		burst int
	}{
		{"NaN rate", math.NaN(), 1},
		{"infinite rate", math.Inf(1), 1},
		{"negative burst", 1, -1},
		{"rate too slow to represent", 1e-12, 100},
	}
	for _, tt := range tests {
		o := opts
		o.Registry = prometheus.NewRegistry()
		o.RateLimit, o.RateBurst = tt.rate, tt.burst
		if _, err := New(o); err == nil {
			t.Errorf("%s: New accepted RateLimit %v, RateBurst %d", tt.name, tt.rate, tt.burst)
		}
	}
}

const meQuery = `{ me { subject } }`

// rateTransports build a request of meQuery for each HTTP transport.
var rateTransports = []struct {
	name string
	req  func(tb testing.TB) *http.Request
}{
	{"POST", func(tb testing.TB) *http.Request { return postRequest(tb, meQuery, nil) }},
	{"GET", func(testing.TB) *http.Request {
		return httptest.NewRequest(http.MethodGet, "/graphql?"+url.Values{"query": {meQuery}}.Encode(), nil)
	}},
	{"SSE", func(tb testing.TB) *http.Request {
		req := postRequest(tb, meQuery, nil)
		req.Header.Set("Accept", "text/event-stream")
		return req
	}},
}

// wantRateLimited checks a refusal: status 429, Retry-After of secs, one RATE_LIMITED error
// whose extensions.retryAfter says the same and whose message gives the rate.
func wantRateLimited(tb testing.TB, rec *httptest.ResponseRecorder, secs int, rate string) {
	tb.Helper()
	if got := rec.Header().Get("Retry-After"); got != strconv.Itoa(secs) {
		tb.Errorf("Retry-After = %q, want %d", got, secs)
	}
	res := decodeResponse(tb, rec)
	wantError(tb, res, http.StatusTooManyRequests, "RATE_LIMITED")
	if len(res.Errors) != 1 {
		return
	}
	if got := res.Errors[0].Extensions["retryAfter"]; got != float64(secs) {
		tb.Errorf("extensions.retryAfter = %v, want %d", got, secs)
	}
	if msg := res.Errors[0].Message; !strings.Contains(msg, rate) || !strings.Contains(msg, fmt.Sprintf("retry in %d s", secs)) {
		tb.Errorf("message %q does not give the rate (%s) and the wait", msg, rate)
	}
}

// TestRateLimitHTTP: over every HTTP transport a principal gets its burst at once, then 429s
// with Retry-After until its bucket refills, while another principal is served meanwhile; each
// request counts once, and refusals are counted in the metric.
func TestRateLimitHTTP(t *testing.T) {
	const rate = "1 requests per second with bursts of 3"
	for _, tr := range rateTransports {
		t.Run(tr.name, func(t *testing.T) {
			clock := newTestClock()
			reg := prometheus.NewRegistry()
			a := newAPI(t, func(o *Options) { o.RateLimit, o.RateBurst, o.now, o.Registry = 1, 3, clock.now, reg })
			send := func(token string) *httptest.ResponseRecorder {
				req := tr.req(t)
				req.Header.Set("Authorization", "Bearer "+token)
				return a.serve(req)
			}
			served := func(who, token string) {
				t.Helper()
				rec := send(token)
				if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.Contains(body, `"subject":"`+who+`"`) {
					t.Fatalf("%s refused: %d %s", who, rec.Code, body)
				}
			}
			alice, bob := a.token(t, "alice"), a.token(t, "bob")
			for range 3 {
				served("alice", alice)
			}
			wantRateLimited(t, send(alice), 1, rate)
			for range 3 {
				served("bob", bob)
			}
			wantRateLimited(t, send(bob), 1, rate)

			clock.advance(500 * time.Millisecond)
			wantRateLimited(t, send(alice), 1, rate) // half a token: retry in 0.5s, rounded up
			clock.advance(500 * time.Millisecond)
			served("alice", alice)
			wantRateLimited(t, send(alice), 1, rate)

			if got := metrictest.Value(t, reg, "computeql_rate_limited_total"); got != 4 {
				t.Errorf("computeql_rate_limited_total = %v, want 4", got)
			}
		})
	}
}

// TestRateLimitDefaults: without settings, a principal gets bursts of 100 at 50 per second.
func TestRateLimitDefaults(t *testing.T) {
	clock := newTestClock()
	a := newAPI(t, func(o *Options) { o.now = clock.now })
	tok := a.token(t, "alice")
	for i := range 100 {
		if res := a.post(t, tok, meQuery, nil); res.Status != http.StatusOK || len(res.Errors) > 0 {
			t.Fatalf("request %d: %d %s", i+1, res.Status, res.Raw)
		}
	}
	req := postRequest(t, meQuery, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	wantRateLimited(t, a.serve(req), 1, "50 requests per second with bursts of 100")
	clock.advance(20 * time.Millisecond)
	if res := a.post(t, tok, meQuery, nil); res.Status != http.StatusOK {
		t.Errorf("after 20ms, one token: %d %s", res.Status, res.Raw)
	}
}

// TestRateLimitOff: a negative RateLimit lets a flood through on every transport.
func TestRateLimitOff(t *testing.T) {
	a, s := wsServer(t, func(o *Options) { o.RateLimit, o.RateBurst, o.now = -1, 1, newTestClock().now })
	tok := a.token(t, "alice")
	for _, tr := range rateTransports {
		for i := range 20 {
			req := tr.req(t)
			req.Header.Set("Authorization", "Bearer "+tok)
			if rec := a.serve(req); rec.Code != http.StatusOK {
				t.Fatalf("%s request %d: %d %s", tr.name, i+1, rec.Code, rec.Body)
			}
		}
	}
	c := mustDialWS(t, wsURL(s), protoTransportWS, wsDial{})
	c.mustAck(tok)
	for i := range 20 {
		if codes, m := c.op(fmt.Sprint("q", i)); codes != nil {
			t.Fatalf("operation %d: %s", i+1, m.Payload)
		}
	}
}

// op runs meQuery as operation id and returns the codes of its errors and its result message,
// after checking that the operation completes: with complete after its result, or, refused
// before it ran on graphql-transport-ws, with its error message alone, which ends it.
func (c *wsClient) op(id string) ([]string, wsMessage) {
	c.tb.Helper()
	c.start(id, meQuery)
	codes, m := c.opErrorCodes()
	if m.ID != id {
		c.tb.Fatalf("result of %s, want %s", m.ID, id)
	}
	if m.Type == "error" && c.proto == protoTransportWS {
		return codes, m
	}
	if end := c.next(); end.Type != "complete" || end.ID != id {
		c.tb.Fatalf("after the result of %s: %+v, want complete", id, end)
	}
	return codes, m
}

// TestRateLimitWebSocket: each operation over a socket counts once against its principal (the
// handshake not at all), in the same bucket as the principal's HTTP requests; one over the
// limit gets a RATE_LIMITED error with retryAfter, and the socket stays open and usable.
func TestRateLimitWebSocket(t *testing.T) {
	for _, proto := range wsProtocols {
		t.Run(proto, func(t *testing.T) {
			clock := newTestClock()
			reg := prometheus.NewRegistry()
			a, s := wsServer(t, func(o *Options) { o.RateLimit, o.RateBurst, o.now, o.Registry = 1, 3, clock.now, reg })
			alice, bob := a.token(t, "alice"), a.token(t, "bob")

			// Authenticated by the handshake, which must not take a token.
			c := mustDialWS(t, wsURL(s), proto, wsDial{header: http.Header{"Authorization": {"Bearer " + alice}}})
			c.init(nil)
			if m := c.next(); m.Type != "connection_ack" {
				t.Fatalf("after connection_init: %+v", m)
			}
			for i := range 3 {
				if codes, m := c.op(fmt.Sprint("q", i)); codes != nil {
					t.Fatalf("operation %d: %s", i+1, m.Payload)
				}
			}
			codes, m := c.op("q3")
			if !reflect.DeepEqual(codes, []string{"RATE_LIMITED"}) {
				t.Fatalf("4th operation: %s %s, want RATE_LIMITED", m.Type, m.Payload)
			}
			var res gqlResponse
			var err error
			if m.Type == "error" {
				err = json.Unmarshal(m.Payload, &res.Errors)
			} else {
				err = json.Unmarshal(m.Payload, &res)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Errors[0].Extensions["retryAfter"]; got != float64(1) {
				t.Errorf("extensions.retryAfter = %v, want 1", got)
			}

			// Another principal's socket is served meanwhile.
			other := mustDialWS(t, wsURL(s), proto, wsDial{})
			other.mustAck(bob)
			for i := range 3 {
				if codes, m := other.op(fmt.Sprint("b", i)); codes != nil {
					t.Fatalf("bob's operation %d: %s", i+1, m.Payload)
				}
			}

			// The refused socket is still open, and runs the next operation once a token is back,
			// which leaves none for alice's HTTP requests: one bucket per principal.
			clock.advance(time.Second)
			if codes, m := c.op("q4"); codes != nil {
				t.Fatalf("after a second: %s", m.Payload)
			}
			req := postRequest(t, meQuery, nil)
			req.Header.Set("Authorization", "Bearer "+alice)
			wantRateLimited(t, a.serve(req), 1, "1 requests per second with bursts of 3")

			if got := metrictest.Value(t, reg, "computeql_rate_limited_total"); got != 2 {
				t.Errorf("computeql_rate_limited_total = %v, want 2", got)
			}
		})
	}
}

// BenchmarkRateLimiter measures allow at the default settings from parallel callers spread
// over 1,000 principals, whose buckets stay in the table (some calls take a token, most are
// refused once the bursts are spent; both cost the same).
func BenchmarkRateLimiter(b *testing.B) {
	l, err := newRateLimiter(50, 100, rateLimitPrincipals, time.Now)
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			l.allow(keys[i%len(keys)])
			i += 7
		}
	})
}

// TestRateLimitCountsTopLevelFields: an operation takes a token per top-level field, fragments
// expanded and __typename aside, so that aliases cost what as many requests do; one of more
// fields than the burst is refused whole, and another principal is unaffected.
func TestRateLimitCountsTopLevelFields(t *testing.T) {
	clock := newTestClock()
	a := newAPI(t, func(o *Options) { o.RateLimit, o.RateBurst, o.now = 1, 5, clock.now })
	alice, bob := a.token(t, "alice"), a.token(t, "bob")
	three := `fragment F on Query { b: me { subject } } { __typename a: me { subject } ...F ... on Query { c: me { subject } } }`
	if res := a.post(t, alice, three, nil); res.Status != http.StatusOK || len(res.Errors) > 0 {
		t.Fatalf("three fields refused: %d %s", res.Status, res.Raw)
	}
	// Five tokens less three leave two. Another three fields: the request takes one, as every
	// request does, and the other two do not fit; one token is left, for one field.
	// Refused as a request over the limit is, though only once parsed: 429 and Retry-After.
	res := a.post(t, alice, three, nil)
	wantError(t, res, http.StatusTooManyRequests, "RATE_LIMITED")
	if msg := res.Errors[0].Message; !strings.Contains(msg, "3 top-level fields counts as 3 requests") {
		t.Errorf("message %q does not say why", msg)
	}
	if after := res.Header.Get("Retry-After"); after != "1" {
		t.Errorf("Retry-After %q, want 1", after)
	}
	if res := a.post(t, alice, `{ me { subject } }`, nil); res.Status != http.StatusOK || len(res.Errors) > 0 {
		t.Fatalf("one field refused with one token left: %d %s", res.Status, res.Raw)
	}
	wantError(t, a.post(t, alice, `{ me { subject } }`, nil), http.StatusTooManyRequests, "RATE_LIMITED")
	// More fields than the burst could never run: refused whole, without a time to retry.
	var six strings.Builder
	for i := range 6 {
		fmt.Fprintf(&six, " f%d: me { subject }", i)
	}
	res = a.post(t, bob, "{"+six.String()+" }", nil)
	wantError(t, res, http.StatusTooManyRequests, "RATE_LIMITED")
	if _, ok := res.Errors[0].Extensions["retryAfter"]; ok || res.Header.Get("Retry-After") != "" {
		t.Errorf("a refusal that waiting cannot lift gives retryAfter: %v %s", res.Header, res.Raw)
	}
	if res := a.post(t, bob, three, nil); res.Status != http.StatusOK || len(res.Errors) > 0 {
		t.Fatalf("bob's three fields refused after an operation refused whole: %d %s", res.Status, res.Raw)
	}
}
