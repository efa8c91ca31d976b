package queue

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"
)

// These are state-table tests of the Lua scripts, one script call each: seed a shard's raw
// Redis state, run the script with the KEYS and ARGV the Go code passes it, and compare the
// raw state after. Shard 0 of a one-shard queue; consumers are "c1" (the caller) and "c2".

// rawShard is one shard's raw state. Stream entries are named by their key: waiting are the
// entries not delivered yet (oldest first), pending the delivered ones (key → consumer).
// dead entries read "key|reason|attempts". A state "q@" is "q" followed by the id of the key's
// entry in the stream (and "Q@" is "Q" followed by it): a waiting key's state names its message.
type rawShard struct {
	waiting  []string
	pending  map[string]string
	state    map[string]string
	attempts map[string]string
	lastErr  map[string]string
	delayed  map[string]int64
	dead     []string
	fence    string
}

func (r rawShard) normalized() rawShard {
	orEmpty := func(m map[string]string) map[string]string {
		if m == nil {
			return map[string]string{}
		}
		return m
	}
	r.pending, r.state, r.attempts, r.lastErr = orEmpty(r.pending), orEmpty(r.state), orEmpty(r.attempts), orEmpty(r.lastErr)
	if r.delayed == nil {
		r.delayed = map[string]int64{}
	}
	if len(r.waiting) == 0 {
		r.waiting = nil
	}
	if len(r.dead) == 0 {
		r.dead = nil
	}
	return r
}

const tableGroup = "workers"

// seedShard writes the state and returns each entry's id by key ("dead:"+key for dead ones).
// Pending entries are added and delivered first, then the waiting ones are added.
func seedShard(t *testing.T, rdb *redis.Client, r rawShard) map[string]string {
	t.Helper()
	ctx := context.Background()
	ids := map[string]string{}
	for key, consumer := range r.pending {
		id := rdb.XAdd(ctx, &redis.XAddArgs{Stream: streamKey(0), Values: []any{"k", key}}).Val()
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: tableGroup, Consumer: consumer,
			Streams: []string{streamKey(0), ">"}, Count: 1, Block: -1}).Result()
		if err != nil || res[0].Messages[0].ID != id {
			t.Fatalf("seed: deliver %s: %v %v", key, res, err)
		}
		ids[key] = id
	}
	for _, key := range r.waiting {
		ids[key] = rdb.XAdd(ctx, &redis.XAddArgs{Stream: streamKey(0), Values: []any{"k", key}}).Val()
	}
	for k, v := range r.state {
		if v == "q@" || v == "Q@" {
			v = v[:1] + ids[k]
		}
		rdb.HSet(ctx, stateKey(0), k, v)
	}
	for k, v := range r.attempts {
		rdb.HSet(ctx, attemptsKey(0), k, v)
	}
	for k, v := range r.lastErr {
		rdb.HSet(ctx, lastErrorKey(0), k, v)
	}
	for k, v := range r.delayed {
		rdb.ZAdd(ctx, delayedKey(0), redis.Z{Score: float64(v), Member: k})
	}
	for _, d := range r.dead {
		f := strings.Split(d, "|")
		ids["dead:"+f[0]] = rdb.XAdd(ctx, &redis.XAddArgs{Stream: deadKey(0),
			Values: []any{"k", f[0], "reason", f[1], "attempts", f[2], "at", 1}}).Val()
	}
	if r.fence != "" {
		rdb.Set(ctx, fenceKey(0), r.fence, 0)
	}
	return ids
}

// dumpShard reads the state back.
func dumpShard(t *testing.T, rdb *redis.Client) rawShard {
	t.Helper()
	ctx := context.Background()
	r := rawShard{pending: map[string]string{}, delayed: map[string]int64{}}
	pend, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: streamKey(0), Group: tableGroup, Start: "-", End: "+", Count: 1000}).Result()
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{}
	for _, p := range pend {
		owner[p.ID] = p.Consumer
	}
	msgs, err := rdb.XRange(ctx, streamKey(0), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	idOf := map[string]string{}
	for _, m := range msgs {
		key, _ := m.Values["k"].(string)
		idOf[key] = m.ID
		if c, ok := owner[m.ID]; ok {
			r.pending[key] = c
			delete(owner, m.ID)
		} else {
			r.waiting = append(r.waiting, key)
		}
	}
	for id, c := range owner {
		t.Errorf("pending entry %s of %s is not in the stream", id, c)
	}
	r.state = rdb.HGetAll(ctx, stateKey(0)).Val()
	for k, v := range r.state {
		if id, ok := idOf[k]; ok && len(v) > 1 && v[1:] == id && (v[0] == 'q' || v[0] == 'Q') {
			r.state[k] = v[:1] + "@"
		}
	}
	r.attempts = rdb.HGetAll(ctx, attemptsKey(0)).Val()
	r.lastErr = rdb.HGetAll(ctx, lastErrorKey(0)).Val()
	for _, z := range rdb.ZRangeWithScores(ctx, delayedKey(0), 0, -1).Val() {
		r.delayed[z.Member.(string)] = int64(z.Score)
	}
	dead, err := rdb.XRange(ctx, deadKey(0), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dead {
		r.dead = append(r.dead, fmt.Sprintf("%s|%s|%s", d.Values["k"], d.Values["reason"], d.Values["attempts"]))
	}
	r.fence = rdb.Get(ctx, fenceKey(0)).Val()
	return r.normalized()
}

type scriptCase struct {
	name string
	init rawShard
	// run calls the script; ids maps keys to their seeded entry ids.
	run        func(ctx context.Context, rdb *redis.Client, ids map[string]string) *redis.Cmd
	wantResult string // fmt.Sprint of the reply; "nil" for a nil reply
	want       rawShard
}

func runScriptCases(t *testing.T, cases []scriptCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rdb, _ := newTestQueue(t, Options{Shards: 1, Group: tableGroup})
			ids := seedShard(t, rdb, tc.init)
			res, err := tc.run(context.Background(), rdb, ids).Result()
			got := fmt.Sprint(res)
			if errors.Is(err, redis.Nil) {
				got = "nil"
			} else if err != nil {
				t.Fatalf("script failed: %v", err)
			}
			if got != tc.wantResult {
				t.Errorf("reply = %s, want %s", got, tc.wantResult)
			}
			if after, want := dumpShard(t, rdb), tc.want.normalized(); !reflect.DeepEqual(after, want) {
				t.Errorf("state after:\n got %+v\nwant %+v", after, want)
			}
		})
	}
}

// The single-key cases run through every script that adds keys now: the batch script with a
// batch of one, the one-key script, and a script of another package's that defines EnqueueLua
// and enqueues an Addition.
func TestEnqueueScript(t *testing.T) {
	shardKeys := []string{streamKey(0), stateKey(0), delayedKey(0)}
	single := []struct {
		name       string
		init       rawShard
		key        string
		wantResult string
		want       rawShard
	}{{
		name:       "idle key is queued",
		key:        "k",
		wantResult: "queued",
		want:       rawShard{waiting: []string{"k"}, state: map[string]string{"k": "q@"}},
	}, {
		name:       "waiting key is left alone",
		init:       rawShard{waiting: []string{"k"}, state: map[string]string{"k": "q@"}},
		key:        "k",
		wantResult: "coalesced",
		want:       rawShard{waiting: []string{"k"}, state: map[string]string{"k": "q@"}},
	}, {
		name:       "key being handled runs once more",
		init:       rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "a7"}},
		key:        "k",
		wantResult: "again",
		want:       rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "d7"}},
	}, {
		name:       "key already marked to run again is left alone",
		init:       rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "d7"}},
		key:        "k",
		wantResult: "coalesced",
		want:       rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "d7"}},
	}, {
		name:       "delayed key runs now and loses its schedule",
		init:       rawShard{state: map[string]string{"k": "s", "other": "s"}, delayed: map[string]int64{"k": 5000, "other": 6000}},
		key:        "k",
		wantResult: "queued",
		want: rawShard{waiting: []string{"k"}, state: map[string]string{"k": "q@", "other": "s"},
			delayed: map[string]int64{"other": 6000}},
	}, {
		name:       "a failed key waiting for its retry runs now, its failures to count",
		init:       rawShard{state: map[string]string{"k": "f"}, attempts: map[string]string{"k": "2"}, delayed: map[string]int64{"k": 5000}},
		key:        "k",
		wantResult: "queued",
		want:       rawShard{waiting: []string{"k"}, state: map[string]string{"k": "Q@"}, attempts: map[string]string{"k": "2"}},
	}, {
		name:       "a key with no state has no schedule to drop: an older version's stays, and runs again when due",
		init:       rawShard{delayed: map[string]int64{"k": 5000}},
		key:        "k",
		wantResult: "queued",
		want:       rawShard{waiting: []string{"k"}, state: map[string]string{"k": "q@"}, delayed: map[string]int64{"k": 5000}},
	}, {
		name:       "delayed key being handled loses its schedule",
		init:       rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "a7"}, delayed: map[string]int64{"k": 5000}},
		key:        "k",
		wantResult: "again",
		want:       rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "d7"}},
	}, {
		name:       "other keys are untouched",
		init:       rawShard{waiting: []string{"x"}, state: map[string]string{"x": "q@"}},
		key:        "k",
		wantResult: "queued",
		want:       rawShard{waiting: []string{"x", "k"}, state: map[string]string{"x": "q@", "k": "q@"}},
	}}
	var cases []scriptCase
	for _, c := range single {
		cases = append(cases, scriptCase{
			name: "batch of one: " + c.name, init: c.init, wantResult: "[" + c.wantResult + "]", want: c.want,
			run: func(ctx context.Context, rdb *redis.Client, _ map[string]string) *redis.Cmd {
				return enqueueScript.Run(ctx, rdb, shardKeys, 1, c.key, 0)
			},
		}, scriptCase{
			name: "one key: " + c.name, init: c.init, wantResult: c.wantResult, want: c.want,
			run: func(ctx context.Context, rdb *redis.Client, _ map[string]string) *redis.Cmd {
				return enqueueOneScript.Run(ctx, rdb, shardKeys, c.key)
			},
		}, scriptCase{
			name: "another package's script: " + c.name, init: c.init, wantResult: c.wantResult, want: c.want,
			run: func(ctx context.Context, rdb *redis.Client, _ map[string]string) *redis.Cmd {
				return addition(ctx, rdb, c.key)
			},
		})
	}
	cases = append(cases, scriptCase{
		name: "one call adds several keys, each as alone, with its own fields",
		init: rawShard{waiting: []string{"w"}, pending: map[string]string{"busy": "c1"},
			state: map[string]string{"w": "q@", "busy": "a4", "new": "s"}, delayed: map[string]int64{"new": 5000}},
		run: func(ctx context.Context, rdb *redis.Client, _ map[string]string) *redis.Cmd {
			return enqueueScript.Run(ctx, rdb, shardKeys, 4, "new", 2, "traceparent", "00-x", "w", 0, "busy", 0, "other", 0)
		},
		wantResult: "[queued coalesced again queued]",
		want: rawShard{waiting: []string{"w", "new", "other"}, pending: map[string]string{"busy": "c1"},
			state: map[string]string{"w": "q@", "busy": "d4", "new": "q@", "other": "q@"}},
	}, scriptCase{
		name: "one key with its fields",
		init: rawShard{state: map[string]string{"new": "s"}, delayed: map[string]int64{"new": 5000}},
		run: func(ctx context.Context, rdb *redis.Client, _ map[string]string) *redis.Cmd {
			return enqueueOneScript.Run(ctx, rdb, shardKeys, "new", "traceparent", "00-x")
		},
		wantResult: "queued",
		want:       rawShard{waiting: []string{"new"}, state: map[string]string{"new": "q@"}},
	})
	runScriptCases(t, cases)
}

// addition enqueues key as a script of another package does: one that defines EnqueueLua and
// does its own work, here a write, and enqueues the Addition of a queue of one shard.
func addition(ctx context.Context, rdb *redis.Client, key string) *redis.Cmd {
	q, err := New(rdb, Options{Shards: 1, Group: tableGroup})
	if err != nil {
		return redis.NewCmdResult(nil, err)
	}
	return runAddition(ctx, rdb, q, key)
}

var otherPackageScript = redis.NewScript(EnqueueLua + `
redis.call('SET', KEYS[4], 'written')
return enqueue(KEYS[1], KEYS[2], KEYS[3], unpack(ARGV))
`)

func runAddition(ctx context.Context, rdb *redis.Client, q *Queue, key string) *redis.Cmd {
	add, err := q.Addition(ctx, key)
	if err != nil {
		return redis.NewCmdResult(nil, err)
	}
	return otherPackageScript.Run(ctx, rdb, append(add.Keys, "other-package"), add.Args...)
}

func TestEnqueueAfterScript(t *testing.T) {
	after := func(key string, at int64) func(context.Context, *redis.Client, map[string]string) *redis.Cmd {
		return func(ctx context.Context, rdb *redis.Client, _ map[string]string) *redis.Cmd {
			return enqueueAfterScript.Run(ctx, rdb, []string{delayedKey(0), stateKey(0)}, key, at)
		}
	}
	runScriptCases(t, []scriptCase{{
		name:       "unscheduled idle key is scheduled, and its state says so",
		run:        after("k", 5000),
		wantResult: "1",
		want:       rawShard{state: map[string]string{"k": "s"}, delayed: map[string]int64{"k": 5000}},
	}, {
		name:       "earlier schedule is kept",
		init:       rawShard{state: map[string]string{"k": "s"}, delayed: map[string]int64{"k": 3000}},
		run:        after("k", 5000),
		wantResult: "1",
		want:       rawShard{state: map[string]string{"k": "s"}, delayed: map[string]int64{"k": 3000}},
	}, {
		name:       "later schedule is brought forward; a failed key's state keeps its failures",
		init:       rawShard{state: map[string]string{"k": "f"}, delayed: map[string]int64{"k": 9000}},
		run:        after("k", 5000),
		wantResult: "1",
		want:       rawShard{state: map[string]string{"k": "f"}, delayed: map[string]int64{"k": 5000}},
	}, {
		name:       "a waiting key keeps its state",
		init:       rawShard{waiting: []string{"k"}, state: map[string]string{"k": "q@"}},
		run:        after("k", 5000),
		wantResult: "1",
		want:       rawShard{waiting: []string{"k"}, state: map[string]string{"k": "q@"}, delayed: map[string]int64{"k": 5000}},
	}})
}

func TestForwardScript(t *testing.T) {
	forward := func(now int64, limit int) func(context.Context, *redis.Client, map[string]string) *redis.Cmd {
		return func(ctx context.Context, rdb *redis.Client, _ map[string]string) *redis.Cmd {
			return forwardScript.Run(ctx, rdb, []string{streamKey(0), stateKey(0), delayedKey(0)}, now, limit)
		}
	}
	runScriptCases(t, []scriptCase{{
		name: "due keys are added, others wait",
		init: rawShard{
			waiting: []string{"w"}, pending: map[string]string{"busy": "c1"},
			state:   map[string]string{"w": "q@", "busy": "a3", "due": "s", "failed": "f", "later": "s"},
			delayed: map[string]int64{"due": 4000, "w": 1000, "busy": 5000, "failed": 4500, "later": 6000},
		},
		run:        forward(5000, 1000),
		wantResult: "4",
		want: rawShard{
			waiting: []string{"w", "due", "failed"}, pending: map[string]string{"busy": "c1"},
			state:   map[string]string{"w": "q@", "busy": "d3", "due": "q@", "failed": "Q@", "later": "s"},
			delayed: map[string]int64{"later": 6000},
		},
	}, {
		name:       "at most the limit, earliest first",
		init:       rawShard{state: map[string]string{"a": "s", "b": "s"}, delayed: map[string]int64{"a": 2000, "b": 1000}},
		run:        forward(5000, 1),
		wantResult: "1",
		want: rawShard{waiting: []string{"b"}, state: map[string]string{"a": "s", "b": "q@"},
			delayed: map[string]int64{"a": 2000}},
	}, {
		name:       "nothing due",
		init:       rawShard{delayed: map[string]int64{"a": 5001}},
		run:        forward(5000, 1000),
		wantResult: "0",
		want:       rawShard{delayed: map[string]int64{"a": 5001}},
	}})
}

// beginAs begins messages in one call as the consumer, with max deliveries 3, now 1000 and a
// dead-letter cap of 100. A message is named by its key, followed by ":r" when it was
// reclaimed; claims first claims each reclaimed one that many times more for the consumer
// (each claim counts a delivery).
func beginAs(consumer string, claims int, msgs ...string) func(context.Context, *redis.Client, map[string]string) *redis.Cmd {
	return func(ctx context.Context, rdb *redis.Client, ids map[string]string) *redis.Cmd {
		args := []any{tableGroup, consumer, 3, 1000, 100, len(msgs)}
		for _, m := range msgs {
			key, reclaimed := strings.CutSuffix(m, ":r")
			mode := "n"
			if reclaimed {
				mode = "r"
				for range claims {
					if err := rdb.XClaim(ctx, &redis.XClaimArgs{Stream: streamKey(0), Group: tableGroup, Consumer: consumer, Messages: []string{ids[key]}}).Err(); err != nil {
						panic(err)
					}
				}
			}
			args = append(args, ids[key], key, mode)
		}
		return beginScript.Run(ctx, rdb, beginShardKeys(0, fenceKey(0)), args...)
	}
}

const neverFinished = "its handler never finished (the worker died or timed out)"

func TestBeginScript(t *testing.T) {
	runScriptCases(t, []scriptCase{{
		name:       "first delivery gets a fence and attempt 1",
		init:       rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "q@"}},
		run:        beginAs("c1", 0, "k"),
		wantResult: "[[ok 1 1 0]]",
		want:       rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "a1"}, fence: "1"},
	}, {
		name: "a failed key counts on; the fence grows for the shard",
		init: rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "Q@"},
			attempts: map[string]string{"k": "2"}, lastErr: map[string]string{"k": "boom"}, fence: "41"},
		run:        beginAs("c1", 0, "k"),
		wantResult: "[[ok 42 3 2]]",
		want: rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "a42"},
			attempts: map[string]string{"k": "2"}, lastErr: map[string]string{"k": "boom"}, fence: "42"},
	}, {
		name: "one call begins every message of a read, each with the next fence",
		init: rawShard{pending: map[string]string{"k1": "c1", "k2": "c1", "k3": "c1"},
			state: map[string]string{"k1": "q@", "k2": "q@", "k3": "q@"}, fence: "10"},
		run:        beginAs("c1", 0, "k1", "k2", "k3"),
		wantResult: "[[ok 11 1 0] [ok 12 1 0] [ok 13 1 0]]",
		want: rawShard{pending: map[string]string{"k1": "c1", "k2": "c1", "k3": "c1"},
			state: map[string]string{"k1": "a11", "k2": "a12", "k3": "a13"}, fence: "13"},
	}, {
		name: "a reclaimed message of a key marked to run again begins (the run sees the newest state); Redis counted the crashed delivery",
		init: rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "d5"},
			attempts: map[string]string{"k": "1"}, fence: "5"},
		run:        beginAs("c1", 1, "k:r"),
		wantResult: "[[ok 6 3 1]]",
		want: rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "a6"},
			attempts: map[string]string{"k": "1"}, fence: "6"},
	}, {
		name:       "a reclaimed message another consumer owns is lost",
		init:       rawShard{pending: map[string]string{"k": "c2"}, state: map[string]string{"k": "a3"}},
		run:        beginAs("c1", 0, "k:r"),
		wantResult: "[[lost]]",
		want:       rawShard{pending: map[string]string{"k": "c2"}, state: map[string]string{"k": "a3"}},
	}, {
		name: "a read message that another consumer reclaimed and began meanwhile is lost; the others of the read begin",
		init: rawShard{pending: map[string]string{"k": "c2", "x": "c1"}, state: map[string]string{"k": "a3", "x": "q@"},
			fence: "3"},
		run:        beginAs("c1", 0, "k", "x"),
		wantResult: "[[lost] [ok 4 1 0]]",
		want: rawShard{pending: map[string]string{"k": "c2", "x": "c1"}, state: map[string]string{"k": "a3", "x": "a4"},
			fence: "4"},
	}, {
		name:       "a read message its key no longer waits for (finished, then added again) is lost",
		init:       rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "q9-9"}},
		run:        beginAs("c1", 0, "k"),
		wantResult: "[[lost]]",
		want:       rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "q9-9"}},
	}, {
		name: "past the delivery limit the key is dead-lettered with its last error",
		init: rawShard{pending: map[string]string{"k": "c1", "x": "c1"}, state: map[string]string{"k": "Q@", "x": "a1"},
			attempts: map[string]string{"k": "3", "x": "1"}, lastErr: map[string]string{"k": "boom", "x": "other"}, fence: "7"},
		run:        beginAs("c1", 0, "k"),
		wantResult: "[[dead boom 3]]",
		want: rawShard{pending: map[string]string{"x": "c1"}, state: map[string]string{"x": "a1"},
			attempts: map[string]string{"x": "1"}, lastErr: map[string]string{"x": "other"},
			dead: []string{"k|boom|3"}, fence: "7"},
	}, {
		name:       "past the limit without an error: deliveries to dead workers counted",
		init:       rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "a2"}},
		run:        beginAs("c1", 3, "k:r"),
		wantResult: "[[dead " + neverFinished + " 3]]",
		want:       rawShard{dead: []string{"k|" + neverFinished + "|3"}},
	}})
}

// finishRun is one run's ARGV for the finish script: its key, fence, "ok" or "failed", earlier
// failed deliveries, attempt, error and when to run again.
type finishRun struct {
	key            string
	fence          int
	status         string
	earlier, tries int
	err            string
	at             int64
}

// finishAs finishes the runs in one call, as the consumer's finisher passes them.
func finishAs(runs ...finishRun) func(context.Context, *redis.Client, map[string]string) *redis.Cmd {
	return func(ctx context.Context, rdb *redis.Client, ids map[string]string) *redis.Cmd {
		args := []any{tableGroup, len(runs)}
		for _, r := range runs {
			args = append(args, ids[r.key], r.key, r.fence, r.status, r.earlier, r.tries, r.err, r.at)
		}
		return finishScript.Run(ctx, rdb, finishShardKeys(0), args...)
	}
}

func TestFinishScript(t *testing.T) {
	handling := func(extra rawShard) rawShard {
		extra.pending = map[string]string{"k": "c1"}
		if extra.state == nil {
			extra.state = map[string]string{"k": "a7"}
		}
		return extra
	}
	runScriptCases(t, []scriptCase{{
		name:       "success acknowledges, deletes and resets the attempts",
		init:       handling(rawShard{attempts: map[string]string{"k": "2"}, lastErr: map[string]string{"k": "boom"}}),
		run:        finishAs(finishRun{"k", 7, "ok", 2, 3, "", 0}),
		wantResult: "[ok]",
		want:       rawShard{},
	}, {
		name:       "failure keeps the attempt and error and schedules the retry",
		init:       handling(rawShard{attempts: map[string]string{"k": "1"}, lastErr: map[string]string{"k": "old"}}),
		run:        finishAs(finishRun{"k", 7, "failed", 1, 2, "boom", 7000}),
		wantResult: "[ok]",
		want: rawShard{state: map[string]string{"k": "f"}, attempts: map[string]string{"k": "2"}, lastErr: map[string]string{"k": "boom"},
			delayed: map[string]int64{"k": 7000}},
	}, {
		name:       "run again later",
		init:       handling(rawShard{}),
		run:        finishAs(finishRun{"k", 7, "ok", 0, 1, "", 7000}),
		wantResult: "[ok]",
		want:       rawShard{state: map[string]string{"k": "s"}, delayed: map[string]int64{"k": 7000}},
	}, {
		name:       "an earlier schedule is kept",
		init:       handling(rawShard{delayed: map[string]int64{"k": 3000}}),
		run:        finishAs(finishRun{"k", 7, "ok", 0, 1, "", 7000}),
		wantResult: "[ok]",
		want:       rawShard{state: map[string]string{"k": "s"}, delayed: map[string]int64{"k": 3000}},
	}, {
		name:       "added while handled: one new message",
		init:       handling(rawShard{state: map[string]string{"k": "d7"}}),
		run:        finishAs(finishRun{"k", 7, "ok", 0, 1, "", 7000}),
		wantResult: "[ok]",
		want:       rawShard{waiting: []string{"k"}, state: map[string]string{"k": "q@"}},
	}, {
		name:       "failed and added while handled: error kept, runs now",
		init:       handling(rawShard{state: map[string]string{"k": "d7"}}),
		run:        finishAs(finishRun{"k", 7, "failed", 0, 1, "boom", 7000}),
		wantResult: "[ok]",
		want: rawShard{waiting: []string{"k"}, state: map[string]string{"k": "Q@"},
			attempts: map[string]string{"k": "1"}, lastErr: map[string]string{"k": "boom"}},
	}, {
		name:       "a run whose key a later run took over changes nothing",
		init:       handling(rawShard{state: map[string]string{"k": "a8"}, attempts: map[string]string{"k": "2"}}),
		run:        finishAs(finishRun{"k", 7, "ok", 2, 3, "", 0}),
		wantResult: "[lost]",
		want:       rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "a8"}, attempts: map[string]string{"k": "2"}},
	}, {
		name: "one call finishes a batch; a stale run in it changes nothing",
		init: rawShard{pending: map[string]string{"k1": "c1", "k2": "c1", "k3": "c2"},
			state: map[string]string{"k1": "a1", "k2": "d2", "k3": "a9"}},
		run:        finishAs(finishRun{"k1", 1, "ok", 0, 1, "", 0}, finishRun{"k3", 3, "ok", 0, 1, "", 0}, finishRun{"k2", 2, "ok", 0, 1, "", 0}),
		wantResult: "[ok lost ok]",
		want: rawShard{waiting: []string{"k2"}, pending: map[string]string{"k3": "c2"},
			state: map[string]string{"k2": "q@", "k3": "a9"}},
	}})
}

func TestBuryScript(t *testing.T) {
	bury := func(fence int) func(context.Context, *redis.Client, map[string]string) *redis.Cmd {
		return func(ctx context.Context, rdb *redis.Client, ids map[string]string) *redis.Cmd {
			return buryScript.Run(ctx, rdb, buryShardKeys(0), tableGroup, ids["k"], "k", fence, "bad input", 2, 1000, 100)
		}
	}
	init := rawShard{pending: map[string]string{"k": "c1"}, state: map[string]string{"k": "d5"},
		attempts: map[string]string{"k": "2"}, lastErr: map[string]string{"k": "boom"}}
	runScriptCases(t, []scriptCase{{
		name:       "terminal error dead-letters at once",
		init:       init,
		run:        bury(5),
		wantResult: "ok",
		want:       rawShard{dead: []string{"k|bad input|2"}},
	}, {
		name:       "a run whose key a later run took over changes nothing",
		init:       init,
		run:        bury(4),
		wantResult: "lost",
		want:       init,
	}})
}

func TestRequeueDeadScript(t *testing.T) {
	requeue := func(id string) func(context.Context, *redis.Client, map[string]string) *redis.Cmd {
		return func(ctx context.Context, rdb *redis.Client, ids map[string]string) *redis.Cmd {
			if real, ok := ids[id]; ok {
				id = real
			}
			return requeueDeadScript.Run(ctx, rdb, []string{streamKey(0), stateKey(0), deadKey(0), delayedKey(0)}, id)
		}
	}
	runScriptCases(t, []scriptCase{{
		name:       "dead letter goes back to the stream",
		init:       rawShard{dead: []string{"k|boom|3", "x|bad|1"}},
		run:        requeue("dead:k"),
		wantResult: "k",
		want:       rawShard{waiting: []string{"k"}, state: map[string]string{"k": "q@"}, dead: []string{"x|bad|1"}},
	}, {
		name:       "key added again meanwhile is not doubled",
		init:       rawShard{waiting: []string{"k"}, state: map[string]string{"k": "q@"}, dead: []string{"k|boom|3"}},
		run:        requeue("dead:k"),
		wantResult: "k",
		want:       rawShard{waiting: []string{"k"}, state: map[string]string{"k": "q@"}},
	}, {
		name:       "unknown id",
		init:       rawShard{dead: []string{"k|boom|3"}},
		run:        requeue("1-1"),
		wantResult: "nil",
		want:       rawShard{dead: []string{"k|boom|3"}},
	}})
}

func TestRenewScript(t *testing.T) {
	ctx := context.Background()
	rdb, _ := newTestQueue(t, Options{Shards: 1, Group: tableGroup})
	ids := seedShard(t, rdb, rawShard{pending: map[string]string{"mine": "c1", "theirs": "c2"}})
	// Both messages have gone unrenewed for 100s.
	for key, c := range map[string]string{"mine": "c1", "theirs": "c2"} {
		if err := rdb.Do(ctx, "XCLAIM", streamKey(0), tableGroup, c, 0, ids[key], "IDLE", 100_000, "JUSTID").Err(); err != nil {
			t.Fatal(err)
		}
	}
	renew := func(consumer string, keys ...string) []int64 {
		args := []any{tableGroup, consumer, len(keys)}
		for _, k := range keys {
			args = append(args, ids[k])
		}
		n, err := renewScript.Run(ctx, rdb, []string{streamKey(0)}, args...).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	pendingOf := func(key string) redis.XPendingExt {
		p := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: streamKey(0), Group: tableGroup, Start: ids[key], End: ids[key], Count: 1}).Val()
		if len(p) != 1 {
			t.Fatalf("%s is not pending", key)
		}
		return p[0]
	}
	if n := renew("c1", "mine"); !reflect.DeepEqual(n, []int64{1}) {
		t.Errorf("renewing an owned message = %v, want [1]", n)
	}
	if p := pendingOf("mine"); p.Idle > 50*time.Second || p.Consumer != "c1" || p.RetryCount != 1 {
		t.Errorf("after renewal: %+v, want idle reset, owner c1, delivery count 1", p)
	}
	if n := renew("c1", "theirs"); !reflect.DeepEqual(n, []int64{0}) {
		t.Errorf("renewing another consumer's message = %v, want [0]", n)
	}
	if p := pendingOf("theirs"); p.Idle < 50*time.Second || p.Consumer != "c2" {
		t.Errorf("a failed renewal changed the message: %+v", p)
	}
	// One call renews what the consumer still owns of all it holds.
	if err := rdb.Do(ctx, "XCLAIM", streamKey(0), tableGroup, "c1", 0, ids["mine"], "IDLE", 100_000, "JUSTID").Err(); err != nil {
		t.Fatal(err)
	}
	if n := renew("c1", "theirs", "mine"); !reflect.DeepEqual(n, []int64{0, 1}) {
		t.Errorf("renewing both in one call = %v, want [0 1]", n)
	}
	if p := pendingOf("mine"); p.Idle > 50*time.Second || p.Consumer != "c1" || p.RetryCount != 1 {
		t.Errorf("after a batch renewal: %+v, want idle reset, owner c1, delivery count 1", p)
	}
	if p := pendingOf("theirs"); p.Idle < 50*time.Second || p.Consumer != "c2" {
		t.Errorf("a batch renewal changed another consumer's message: %+v", p)
	}
}

func TestPruneConsumersScript(t *testing.T) {
	ctx := context.Background()
	rdb, q := newTestQueue(t, Options{Shards: 1, Group: tableGroup})
	for _, c := range []string{"ghost", "ghost2", "self"} {
		if err := rdb.XGroupCreateConsumer(ctx, streamKey(0), tableGroup, c).Err(); err != nil {
			t.Fatal(err)
		}
	}
	seedShard(t, rdb, rawShard{pending: map[string]string{"k": "holder"}})
	consumers := func() map[string]int64 {
		cs, err := rdb.XInfoConsumers(ctx, streamKey(0), tableGroup).Result()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, c := range cs {
			out[c.Name] = c.Pending
		}
		return out
	}
	eventually.Holds(t, waitLimit, func() bool {
		cs, _ := rdb.XInfoConsumers(ctx, streamKey(0), tableGroup).Result()
		for _, c := range cs {
			if c.Idle < 30*time.Millisecond {
				return false
			}
		}
		return true
	}, "consumers idle for 30ms")
	prune := func(limit time.Duration) int64 {
		n, err := pruneConsumersScript.Run(ctx, rdb, []string{streamKey(0)}, tableGroup, limit.Milliseconds(), "self").Int64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := prune(time.Hour); n != 0 {
		t.Errorf("pruned %d consumers idle less than the limit", n)
	}
	if got, want := consumers(), map[string]int64{"ghost": 0, "ghost2": 0, "self": 0, "holder": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("consumers = %v, want %v", got, want)
	}
	if n := prune(10 * time.Millisecond); n != 2 {
		t.Errorf("pruned %d consumers, want 2", n)
	}
	// The holder is as idle as the ghosts but keeps its pending message; the caller stays.
	if got, want := consumers(), map[string]int64{"self": 0, "holder": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("consumers = %v, want %v", got, want)
	}
	if n := pendingCount(t, rdb, q, 0); n != 1 {
		t.Errorf("pending = %d, want 1", n)
	}
}

func TestTakeScript(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		want  int
		taken []string // keys taken, in order, each begun with the next fence
	}{
		{"finishes the runs, then reads and begins as many as asked and no more", 2, []string{"w1", "w2"}},
		{"asked for none, only finishes", 0, nil},
		{"asked for more than wait, takes all", 5, []string{"w1", "w2", "w3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, _ := newTestQueue(t, Options{Shards: 1, Group: tableGroup})
			ids := seedShard(t, rdb, rawShard{pending: map[string]string{"k": "c1"}, waiting: []string{"w1", "w2", "w3"},
				state: map[string]string{"k": "a5", "w1": "q@", "w2": "q@", "w3": "q@"}, fence: "5"})
			res, err := takeScript.Run(ctx, rdb, takeShardKeys(0, fenceKey(0)), tableGroup, "c1", 3, 1000, 100, tc.want, 0,
				1, ids["k"], "k", 5, "ok", 0, 1, "", 0).Slice()
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(res[0]); got != "[ok]" {
				t.Errorf("finished = %s, want [ok]", got)
			}
			taken, _ := res[1].([]any)
			want := rawShard{pending: map[string]string{}, state: map[string]string{}, fence: "5"}
			if len(taken) != len(tc.taken) {
				t.Fatalf("took %v, want %v", taken, tc.taken)
			}
			for i, key := range tc.taken {
				fence := 6 + i
				if got, wantTaken := fmt.Sprint(taken[i]), fmt.Sprintf("[0 %s [k %s] [ok %d 1 0]]", ids[key], key, fence); got != wantTaken {
					t.Errorf("taken[%d] = %s, want %s", i, got, wantTaken)
				}
				want.pending[key] = "c1"
				want.state[key] = fmt.Sprint("a", fence)
				want.fence = fmt.Sprint(fence)
			}
			for _, key := range []string{"w1", "w2", "w3"} {
				if _, ok := want.pending[key]; !ok {
					want.waiting = append(want.waiting, key)
					want.state[key] = "q@"
				}
			}
			if after := dumpShard(t, rdb); !reflect.DeepEqual(after, want.normalized()) {
				t.Errorf("state after:\n got %+v\nwant %+v", after, want.normalized())
			}
		})
	}
}

// Over several shards, a take never takes more than asked, takes all there is when asked for
// more, and reads many shards at once: as many as messages are still wanted, then the shards
// that gave their whole share again.
func TestTakeScriptReadsShardsInFewReads(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name         string
		want         int
		taken, reads int
	}{
		// Shards 0 to 3 hold 3, 0, 1 and 2 messages. Asked for 4: one read of all four
		// shards, a message apiece, gives 3; shard 0 had its share and gives the fourth.
		{"asked for fewer than wait", 4, 4, 2},
		// Asked for 10: all four shards, 2 apiece, give 5; shards 0 and 3 had their share,
		// and are read again for the rest (shard 0 has one more, shard 3 none).
		{"asked for more than wait", 10, 6, 3},
		{"asked for one", 1, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, q := newTestQueue(t, Options{Shards: 4, Group: tableGroup})
			var keys []string
			for shard, n := range []int{3, 0, 1, 2} {
				keys = append(keys, q.keys[shard].take...)
				for i := range n {
					addWaiting(t, rdb, shard, fmt.Sprintf("s%d-%d", shard, i))
				}
			}
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			res, err := takeScript.Run(ctx, rdb, keys, tableGroup, "c1", 3, 1000, 100, tc.want, 0, 0, 0, 0, 0).Slice()
			if err != nil {
				t.Fatal(err)
			}
			if taken, _ := res[1].([]any); len(taken) != tc.taken {
				t.Errorf("took %d messages, want %d: %v", len(taken), tc.taken, taken)
			}
			if n := commandCalls(t, rdb, "xreadgroup"); n != tc.reads {
				t.Errorf("%d XREADGROUPs, want %d", n, tc.reads)
			}
		})
	}
}

func TestHandBackScript(t *testing.T) {
	handBack := func(keys ...string) func(context.Context, *redis.Client, map[string]string) *redis.Cmd {
		return func(ctx context.Context, rdb *redis.Client, ids map[string]string) *redis.Cmd {
			args := []any{tableGroup, "c1"}
			for _, k := range keys {
				args = append(args, ids[k], k)
			}
			return handBackScript.Run(ctx, rdb, []string{streamKey(0), stateKey(0)}, args...)
		}
	}
	runScriptCases(t, []scriptCase{{
		name: "unbegun messages go back as new entries; a key with earlier failures keeps them",
		init: rawShard{pending: map[string]string{"k": "c1", "f": "c1"}, state: map[string]string{"k": "q@", "f": "Q@"},
			attempts: map[string]string{"f": "2"}},
		run:        handBack("k", "f"),
		wantResult: "2",
		want: rawShard{waiting: []string{"k", "f"}, state: map[string]string{"k": "q@", "f": "Q@"},
			attempts: map[string]string{"f": "2"}},
	}, {
		name:       "a message another consumer owns, or one its key no longer waits for, is left alone",
		init:       rawShard{pending: map[string]string{"o": "c2", "b": "c1"}, state: map[string]string{"o": "q@", "b": "a4"}},
		run:        handBack("o", "b"),
		wantResult: "0",
		want:       rawShard{pending: map[string]string{"o": "c2", "b": "c1"}, state: map[string]string{"o": "q@", "b": "a4"}},
	}})
}

// On a standalone Redis a begin of several shards' messages takes their fencing tokens from
// shard 0's counter, with one INCRBY.
func TestBeginFencesEveryShardWithOneCount(t *testing.T) {
	ctx := context.Background()
	rdb, q := newTestQueue(t, Options{Shards: 4, Group: tableGroup})
	var keys []string
	args := []any{tableGroup, "c1", 3, 1000, 100}
	for shard := range 3 {
		key := fmt.Sprintf("s%d", shard)
		id := addWaiting(t, rdb, shard, key)
		if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: tableGroup, Consumer: "c1",
			Streams: []string{streamKey(shard), ">"}, Count: 1, Block: -1}).Err(); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, q.keys[shard].begin...)
		args = append(args, 1, id, key, "n")
	}
	if err := rdb.Set(ctx, fenceKey(0), 40, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := beginScript.Run(ctx, rdb, keys, args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(res); got != "[[ok 41 1 0] [ok 42 1 0] [ok 43 1 0]]" {
		t.Errorf("verdicts %s, want fences 41, 42 and 43", got)
	}
	for shard := range 3 {
		if st, want := rdb.HGet(ctx, stateKey(shard), fmt.Sprintf("s%d", shard)).Val(), fmt.Sprint("a", 41+shard); st != want {
			t.Errorf("shard %d: state %q, want %q", shard, st, want)
		}
	}
	if n := rdb.Get(ctx, fenceKey(0)).Val(); n != "43" {
		t.Errorf("shard 0's counter is %s, want 43", n)
	}
	if n := rdb.Exists(ctx, fenceKey(1), fenceKey(2)).Val(); n != 0 {
		t.Errorf("%d other shards' counters were written", n)
	}
	if n := commandCalls(t, rdb, "incrby"); n != 1 {
		t.Errorf("%d INCRBYs, want one", n)
	}
}

// addWaiting appends a message of the key to the shard's stream, its state naming it as
// waiting, as an enqueue does, and returns its id.
func addWaiting(t *testing.T, rdb *redis.Client, shard int, key string) string {
	t.Helper()
	ctx := context.Background()
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: streamKey(shard), Values: []any{"k", key}}).Result()
	if err == nil {
		err = rdb.HSet(ctx, stateKey(shard), key, "q"+id).Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// commandCalls is how often Redis ran the command (scripts' calls included) since the last
// CONFIG RESETSTAT.
func commandCalls(t *testing.T, rdb *redis.Client, name string) int {
	t.Helper()
	stats, err := rdb.InfoMap(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	fmt.Sscanf(stats["Commandstats"]["cmdstat_"+name], "calls=%d,", &n)
	return n
}

// Setup brings every shard's fence counter up to the highest, so that fences go on increasing
// for every shard's keys when a deployment moves between a standalone Redis (one counter) and a
// Redis Cluster (one a shard), either way.
func TestSetupRaisesFenceCounters(t *testing.T) {
	ctx := context.Background()
	rdb, q := newTestQueue(t, Options{Shards: 4})
	for shard, n := range map[int]int{0: 10, 2: 50, 3: 7} {
		if err := rdb.Set(ctx, fenceKey(shard), n, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	for shard := range 4 {
		if n := rdb.Get(ctx, fenceKey(shard)).Val(); n != "50" {
			t.Errorf("shard %d's counter is %q, want 50", shard, n)
		}
	}
	if err := rdb.Set(ctx, fenceKey(1), 60, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := q.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Get(ctx, fenceKey(0)).Val(); n != "60" {
		t.Errorf("shard 0's counter is %q after another shard's reached 60", n)
	}
}
