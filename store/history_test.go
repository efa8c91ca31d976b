package store

import (
	"cmp"
	"slices"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/instance"
)

// historyIDs is the event ids of a page of history, in order.
func historyIDs(t *testing.T, s *Store, id, after string, limit int) ([]string, bool) {
	t.Helper()
	page, more, err := s.History(ctx, "acme", id, after, limit)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(page))
	for i, r := range page {
		ids[i] = r.Cursor
	}
	return ids, more
}

// warn appends n warning events to the instance's history.
func warn(t *testing.T, s *Store, inst *instance.Instance, n int) {
	t.Helper()
	for range n {
		if ok, err := s.Warn(ctx, inst, eventTime, "w"); err != nil || !ok {
			t.Fatal(err, ok)
		}
	}
}

// TestHistoryMembersSortAsTheirIDs: the history index's members, compared bytewise as a sorted
// set of equal scores compares them, come in the order of the event ids they stand for, and
// give those ids back; the sequence numbers that a plain string order gets wrong included.
func TestHistoryMembersSortAsTheirIDs(t *testing.T) {
	rdb := redisServer.Client(t)
	ids := []string{"0-0", "0-1", "5-9", "5-10", "5-11", "10-0", "99-100", "100-2", "1764300000000-0",
		"1764300000000-9", "1764300000000-10", "18446744073709551615-18446744073709551615"}
	type pair struct{ member, id string }
	pairs := make([]pair, len(ids))
	for i, id := range ids {
		member, back := historyCodec(t, rdb, id)
		pairs[i] = pair{member, back}
		if back != id {
			t.Errorf("historyID(historyMember(%q)) = %q", id, back)
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int { return cmp.Compare(a.member, b.member) })
	for i, p := range pairs {
		if p.id != ids[i] {
			t.Fatalf("members in byte order give %q at %d, want %q", p.id, i, ids[i])
		}
	}
}

// TestHistoryIndexIsSmall: an instance's history index costs Redis a few hundred bytes for a
// short history. As a stream it cost 4.7 KB from its first entry (a stream's first node is
// allocated 4 KiB), two thirds of what a new instance cost Redis in all.
func TestHistoryIndexIsSmall(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	inst := create(t, s, newInstance("acme", "web", "a"))
	warn(t, s, inst, 4)
	bytes, err := rdb.MemoryUsage(ctx, historyKey("acme", inst.ID)).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("history index of 5 events: %d bytes", bytes)
	if bytes > 512 {
		t.Errorf("a history index of 5 events takes %d bytes, want at most 512", bytes)
	}
}

// TestHistoryIndexKeepsItsBound: an instance's index keeps its newest historyKept events,
// trimmed a batch at a time once historyTrimmed more have come.
func TestHistoryIndexKeepsItsBound(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	inst := create(t, s, newInstance("acme", "web", "a"))
	warn(t, s, inst, historyKept+historyTrimmed-1)
	if n := rdb.ZCard(ctx, historyKey("acme", inst.ID)).Val(); n != historyKept+historyTrimmed {
		t.Fatalf("index of %d events holds %d", historyKept+historyTrimmed, n)
	}
	warn(t, s, inst, 1)
	if n := rdb.ZCard(ctx, historyKey("acme", inst.ID)).Val(); n != historyKept {
		t.Fatalf("index after one more holds %d, want %d", n, historyKept)
	}
	all := events(t, rdb, "acme")
	want := make([]string, historyKept)
	for i, m := range all[len(all)-historyKept:] {
		want[i] = m.ID
	}
	if ids, more := historyIDs(t, s, inst.ID, "", historyKept+1); more || !slices.Equal(ids, want) {
		t.Errorf("history: %d events (more %v), want the newest %d", len(ids), more, historyKept)
	}

	// A stream index the earlier version trimmed only about as far (MAXLEN ~) is trimmed
	// once moved.
	old := create(t, s, newInstance("acme", "web", "old"))
	rdb.Del(ctx, historyKey("acme", old.ID))
	for i := range historyKept + historyTrimmed + 35 {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: legacyHistoryKey("acme", old.ID), ID: "1-" + strconv.Itoa(i+1), Values: []any{"k", "WARNING"}})
	}
	warn(t, s, old, 1)
	if n := rdb.ZCard(ctx, historyKey("acme", old.ID)).Val(); n != historyKept {
		t.Errorf("index moved from a stream of %d holds %d, want %d", historyKept+historyTrimmed+35, n, historyKept)
	}
}

// TestHistoryOfAnIndexWrittenAsAStream: an instance made by a version that kept its history
// index as a stream loses no history. Its stream's entries are read with the sorted set's, in
// order, also while processes of both versions append to one instance (a rolling upgrade);
// the next event moves the stream into the sorted set.
func TestHistoryOfAnIndexWrittenAsAStream(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	inst := create(t, s, newInstance("acme", "web", "a"))
	warn(t, s, inst, 5)
	all := events(t, rdb, "acme")
	want := make([]string, len(all))
	for i, m := range all {
		want[i] = m.ID
	}
	// As the earlier version indexed them: the first four in a stream, each with its kind.
	// The last two stay in the sorted set, as if a process of this version appended them
	// during the upgrade.
	legacy := legacyHistoryKey("acme", inst.ID)
	for _, m := range all[:4] {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: legacy, ID: m.ID, Values: []any{"k", m.Values["kind"]}})
		rdb.ZRem(ctx, historyKey("acme", inst.ID), historyMemberOf(t, rdb, m.ID))
	}
	if n := rdb.ZCard(ctx, historyKey("acme", inst.ID)).Val(); n != 2 {
		t.Fatalf("sorted set holds %d, want 2", n)
	}
	if ids, more := historyIDs(t, s, inst.ID, "", 10); more || !slices.Equal(ids, want) {
		t.Fatalf("history of both indexes: %v (more %v), want %v", ids, more, want)
	}
	var paged []string
	after := ""
	for {
		ids, more := historyIDs(t, s, inst.ID, after, 4)
		paged = append(paged, ids...)
		if !more {
			break
		}
		after = ids[len(ids)-1]
	}
	if !slices.Equal(paged, want) {
		t.Fatalf("history in pages of 4: %v, want %v", paged, want)
	}

	// A stream alone (no event since the upgrade) is read as well, and a page of it says
	// whether more follow.
	rdb.Del(ctx, historyKey("acme", inst.ID))
	for _, m := range all[4:] {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: legacy, ID: m.ID, Values: []any{"k", m.Values["kind"]}})
	}
	if ids, more := historyIDs(t, s, inst.ID, "", 10); more || !slices.Equal(ids, want) {
		t.Fatalf("history of the stream alone: %v (more %v), want %v", ids, more, want)
	}
	if ids, more := historyIDs(t, s, inst.ID, "", len(want)-1); !more || !slices.Equal(ids, want[:len(want)-1]) {
		t.Fatalf("a page one short of the stream alone: %v (more %v), want %v and more", ids, more, want[:len(want)-1])
	}
	// The next event moves it.
	warn(t, s, inst, 1)
	all = events(t, rdb, "acme")
	want = append(want, all[len(all)-1].ID)
	if n := rdb.Exists(ctx, legacy).Val(); n != 0 {
		t.Error("the stream is left after the next event")
	}
	if n := rdb.ZCard(ctx, historyKey("acme", inst.ID)).Val(); n != int64(len(want)) {
		t.Errorf("sorted set holds %d after the move, want %d", n, len(want))
	}
	if ids, _ := historyIDs(t, s, inst.ID, "", 10); !slices.Equal(ids, want) {
		t.Errorf("history after the move: %v, want %v", ids, want)
	}

	// During an upgrade a process of the earlier version may index an event in a stream
	// after the sorted set exists, between events this version indexes: reads keep the order.
	warn(t, s, inst, 1)
	all = events(t, rdb, "acme")
	older := all[len(all)-1]
	rdb.ZRem(ctx, historyKey("acme", inst.ID), historyMemberOf(t, rdb, older.ID))
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: legacy, ID: older.ID, Values: []any{"k", older.Values["kind"]}})
	warn(t, s, inst, 1)
	all = events(t, rdb, "acme")
	want = append(want, older.ID, all[len(all)-1].ID)
	for _, limit := range []int{1, 2, 3, 10} {
		var paged []string
		after := ""
		for {
			ids, more := historyIDs(t, s, inst.ID, after, limit)
			paged = append(paged, ids...)
			if !more || len(ids) == 0 {
				break
			}
			after = ids[len(ids)-1]
		}
		if !slices.Equal(paged, want) {
			t.Errorf("history of interleaved indexes in pages of %d: %v, want %v", limit, paged, want)
		}
	}
}

// historyCodecScript gives an event id's index member, as the scripts write it, and the id
// historyID reads back from it.
var historyCodecScript = redis.NewScript(historyLua + `
local m = historyMember(ARGV[1])
return {m, historyID(m)}
`)

func historyCodec(t *testing.T, rdb *redis.Client, id string) (member, back string) {
	t.Helper()
	got, err := historyCodecScript.Run(ctx, rdb, nil, id).StringSlice()
	if err != nil || len(got) != 2 {
		t.Fatalf("history codec of %q: %v, %v", id, got, err)
	}
	return got[0], got[1]
}

// historyMemberOf is the index member of an event id, as the scripts write it.
func historyMemberOf(t *testing.T, rdb *redis.Client, id string) string {
	t.Helper()
	m, _ := historyCodec(t, rdb, id)
	return m
}
