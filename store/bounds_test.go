package store

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/redistest"
)

// maximal returns an instance with every field a caller or the system can fill at its
// limit, in the widest characters: what the log's bounds must hold for.
func maximal(org, project string) *instance.Instance {
	inst := newInstance(org, project, strings.Repeat("n", 63))
	wide := func(n int) string { return strings.Repeat("𝔵", n) } // four bytes each
	inst.Description = wide(instance.MaxDescription)
	for i := range instance.MaxTags {
		inst.Tags = append(inst.Tags, instance.Tag{Name: fmt.Sprintf("%02d", i) + wide(instance.MaxTagName-2), Value: wide(instance.MaxTagValue)})
	}
	inst.UserData = []byte(strings.Repeat("u", instance.MaxUserDataBytes))
	for i := range instance.MaxSecurityGroup {
		inst.Networking.SecurityGroupIDs = append(inst.Networking.SecurityGroupIDs, fmt.Sprintf("sg-%060d", i))
	}
	for i := range instance.MaxSourceCIDRs {
		inst.Networking.AllowedSourceAddresses = append(inst.Networking.AllowedSourceAddresses, fmt.Sprintf("10.%d.%d.0/24", i, i))
	}
	inst.CreatedBy, inst.UpdatedBy = strings.Repeat("𝔭", 64), strings.Repeat("𝔭", 64)
	// The one condition there is, its message cut as the domain cuts it.
	inst.Status.Conditions = []instance.Condition{{Type: instance.ConditionAvailable, Message: instance.BoundMessage(strings.Repeat("𝔠", instance.MaxMessageBytes))}}
	return inst
}

// maxEventBytes is the documented bound of what one event costs Redis.
const maxEventBytes = 8 << 10

// TestEventsOfAMaximalInstanceStaySmall: with every field at its limit, an update costs Redis
// at most maxEventBytes per event, because events carry no copy of the large fields (a copy
// of the user data alone is 32 KiB), and condition and event messages are cut to their bound.
func TestEventsOfAMaximalInstanceStaySmall(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	inst := create(t, s, maximal("acme", "web"))
	long := strings.Repeat("𝔪", 4*instance.MaxMessageBytes)
	const updates = 500
	before := redistest.UsedMemory(t, rdb)
	for i := range updates {
		inst.Description = strconv.Itoa(i) + inst.Description[len(strconv.Itoa(i)):]
		if r, err := s.UpdateSpec(ctx, inst, nil, roomy, nil, []string{"description"}, instance.Idempotency{}); err != nil || r != nil {
			t.Fatal(err, r)
		}
		inst.Generation++
		if ok, err := s.WriteStatus(ctx, inst, inst.Status, instance.Event{Kind: instance.EventStatusChanged, At: eventTime, Message: long}); err != nil || !ok {
			t.Fatal(err, ok)
		}
		inst.StatusVersion++
	}
	perEvent := (redistest.UsedMemory(t, rdb) - before) / (2 * updates)
	t.Logf("%d bytes of Redis memory per event of a maximal instance", perEvent)
	if perEvent > maxEventBytes {
		t.Errorf("%d bytes of Redis memory per event, want at most %d", perEvent, maxEventBytes)
	}
	for _, m := range events(t, rdb, "acme") {
		for _, big := range []string{"𝔵𝔵𝔵𝔵", strings.Repeat("u", 64)} {
			for k, v := range m.Values {
				if strings.Contains(v.(string), big) {
					t.Fatalf("event %s copies a large field in %s", m.ID, k)
				}
			}
		}
		if msg := m.Values["msg"].(string); len(msg) > instance.MaxMessageBytes+len("…") {
			t.Fatalf("event %s has a message of %d bytes", m.ID, len(msg))
		}
	}
}

// TestEventInstancesReadTheirLargeFieldsFromTheInstance: an instance read from the log has
// the instance's current large fields, read when asked for, and none once it is gone.
func TestEventInstancesReadTheirLargeFieldsFromTheInstance(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	inst := create(t, s, newInstance("acme", "web", "a"))
	inst.Description, inst.Tags, inst.UserData = "now", []instance.Tag{{Name: "k", Value: "v"}}, []byte("#cloud-config")
	if r, err := s.UpdateSpec(ctx, inst, nil, roomy, nil, []string{"description", "tags", "userData"}, instance.Idempotency{}); err != nil || r != nil {
		t.Fatal(err, r)
	}
	inst.Generation++
	page, _, err := s.History(ctx, "acme", inst.ID, "", 10)
	if err != nil || len(page) != 2 {
		t.Fatalf("history: %d events, %v", len(page), err)
	}
	created := page[0].Instance
	if !created.Partial() || created.Description != "" {
		t.Fatalf("an instance from the log carries description %q (partial: %v)", created.Description, created.Partial())
	}
	desc, err1 := created.Large(ctx, instance.FieldDescription)
	tags, err2 := created.Large(ctx, instance.FieldTags)
	ud, err3 := created.Large(ctx, instance.FieldUserData)
	if err := errors.Join(err1, err2, err3); err != nil || desc.Description != "now" || len(tags.Tags) != 1 || string(ud.UserData) != "#cloud-config" {
		t.Errorf("large fields of the CREATED event's instance: %q %v %q, %v; want the current ones", desc.Description, tags.Tags, ud.UserData, err)
	}

	if ok, err := s.Forget(ctx, inst, eventTime); err != nil || !ok {
		t.Fatal(err, ok)
	}
	msgs := events(t, rdb, "acme")
	deleted, err := s.decodeRecords("acme", msgs[len(msgs)-1:])
	if err != nil {
		t.Fatal(err)
	}
	if large, err := deleted[0].Instance.Large(ctx, instance.FieldTags); err != nil || large.Tags != nil {
		t.Errorf("tags of a forgotten instance: %+v, %v; want none", large, err)
	}
	if n, _ := rdb.Exists(ctx, historyKey("acme", inst.ID)).Result(); n != 1 {
		t.Error("the history index of a forgotten instance is gone: its history is kept after deletion")
	}
}

// TestLogIsBoundedInBytesAndCount: the log drops its oldest events past eventsKeptBytes or
// eventsKept, whichever comes first, and its byte count stays the sum of what it holds. It
// drops them in batches: a trim reads the log once for eventsTrimmed appends and more, not
// once an append.
func TestLogIsBoundedInBytesAndCount(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	check := func(wantLenBound bool) {
		t.Helper()
		msgs, err := rdb.XRange(ctx, eventsKey("acme"), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		sum := 0
		for _, m := range msgs {
			n, _ := strconv.Atoi(m.Values["n"].(string))
			sum += n
		}
		counted, _ := rdb.Get(ctx, eventBytesKey("acme")).Int()
		if counted != sum || sum > eventsKeptBytes || len(msgs) > eventsKept {
			t.Fatalf("log of %d events, %d bytes counted, %d held; want at most %d events and %d bytes, counted as held",
				len(msgs), counted, sum, eventsKept, eventsKeptBytes)
		}
		if lenBound := len(msgs) >= eventsKept-eventsTrimmed; wantLenBound != lenBound {
			t.Fatalf("log of %d events after %s", len(msgs), map[bool]string{true: "many small events", false: "large events"}[wantLenBound])
		}
	}

	big := create(t, s, maximal("acme", "web"))
	long := strings.Repeat("m", instance.MaxMessageBytes)
	for range 3 * eventsKeptBytes / maxEventBytes {
		if ok, err := s.WriteStatus(ctx, big, big.Status, instance.Event{Kind: instance.EventStatusChanged, At: eventTime, Message: long}); err != nil || !ok {
			t.Fatal(err, ok)
		}
		big.StatusVersion++
	}
	check(false)

	small := create(t, s, newInstance("acme", "web", "s"))
	before := xrangeCalls(t, rdb)
	const appends = eventsKept + 100
	for range appends {
		if ok, err := s.Warn(ctx, small, eventTime, ""); err != nil || !ok {
			t.Fatal(err, ok)
		}
	}
	check(true)
	// Each trim drops eventsTrimmed+1 small events, or eventsTrimmedBytes of the large ones
	// (some 50): once per 32 appends at most, where it was once per append.
	if trims, most := xrangeCalls(t, rdb)-before, appends/(eventsTrimmed/2); trims > most {
		t.Errorf("%d trims for %d appends; want at most %d", trims, appends, most)
	}
}

// xrangeCalls is how many XRANGE commands Redis has run, from scripts included.
func xrangeCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.InfoMap(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	stat := info["Commandstats"]["cmdstat_xrange"] // calls=N,usec=...
	calls, _, _ := strings.Cut(strings.TrimPrefix(stat, "calls="), ",")
	n, _ := strconv.Atoi(calls)
	return n
}

// TestHistoryPageWorkDoesNotGrowWithTheLog: a page of one instance's history costs Redis the
// same commands, in one round trip, whether the organization's log holds 100 events or
// 10,000 (before the history index, a page read the log 500 entries at a time).
func TestHistoryPageWorkDoesNotGrowWithTheLog(t *testing.T) {
	work := func(logLen int) (calls, roundTrips int) {
		rdb := redisServer.Client(t)
		s := New(rdb)
		if err := s.Load(ctx); err != nil {
			t.Fatal(err)
		}
		watched := create(t, s, newInstance("acme", "web", "watched"))
		for range 4 {
			if ok, err := s.Warn(ctx, watched, eventTime, "w"); err != nil || !ok {
				t.Fatal(err, ok)
			}
		}
		other := create(t, s, newInstance("acme", "web", "other"))
		for range logLen - 6 {
			if ok, err := s.Warn(ctx, other, eventTime, ""); err != nil || !ok {
				t.Fatal(err, ok)
			}
		}
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		counter := &redistest.RoundTrips{}
		rdb.AddHook(counter)
		page, more, err := s.History(ctx, "acme", watched.ID, "", 3)
		if err != nil || len(page) != 3 || !more {
			t.Fatalf("history page: %d events, more %v, %v", len(page), more, err)
		}
		rest, more, err := s.History(ctx, "acme", watched.ID, page[2].Cursor, 3)
		if err != nil || len(rest) != 2 || more {
			t.Fatalf("second page: %d events, more %v, %v", len(rest), more, err)
		}
		trips := int(counter.N())
		return xrangeCalls(t, rdb), trips
	}
	smallCalls, smallTrips := work(100)
	largeCalls, largeTrips := work(10_000)
	t.Logf("two pages: %d XRANGE in %d round trips on a log of 100, %d in %d on 10,000", smallCalls, smallTrips, largeCalls, largeTrips)
	if largeCalls != smallCalls || largeTrips != smallTrips || largeTrips > 2 {
		t.Errorf("two pages cost %d XRANGE in %d round trips on a log of 10,000, %d in %d on 100; want the same, one round trip a page",
			largeCalls, largeTrips, smallCalls, smallTrips)
	}
}

// TestDeletedInstancesKeepTheirHistoryUpToABound: a forgotten instance's history index stays
// and the instance is found among the deleted with its project, until deletedKept more recent
// deletions push it out, when its index goes too.
func TestDeletedInstancesKeepTheirHistoryUpToABound(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	forget := func(name string, at time.Time) *instance.Instance {
		t.Helper()
		inst := create(t, s, newInstance("acme", "web", name))
		if ok, err := s.Forget(ctx, inst, at); err != nil || !ok {
			t.Fatal(err, ok)
		}
		return inst
	}
	first := forget("first", eventTime)
	if org, project, err := s.Deleted(ctx, []string{"globex", "acme"}, first.ID); err != nil || org != "acme" || project != "web" {
		t.Fatalf("deleted instance: %s/%s, %v", org, project, err)
	}
	if page, _, err := s.History(ctx, "acme", first.ID, "", 10); err != nil || len(page) != 2 {
		t.Fatalf("history of a deleted instance: %d events, %v", len(page), err)
	}
	// As an instance deleted before the index was a sorted set would have it: its index as a
	// stream too, which goes with it.
	legacy := legacyHistoryKey("acme", first.ID)
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: legacy, ID: "1-1", Values: []any{"k", "CREATED"}}).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range deletedKept {
		forget(fmt.Sprintf("later-%d", i), eventTime.Add(time.Duration(i+1)*time.Millisecond))
	}
	if _, _, err := s.Deleted(ctx, []string{"acme"}, first.ID); !errors.Is(err, instance.ErrNotFound) {
		t.Errorf("the oldest deleted instance after %d more: %v, want ErrNotFound", deletedKept, err)
	}
	if n, _ := rdb.Exists(ctx, historyKey("acme", first.ID), legacy).Result(); n != 0 {
		t.Errorf("%d of its history indexes are left behind", n)
	}
	if n, _ := rdb.HLen(ctx, deletedKey("acme")).Result(); n != deletedKept {
		t.Errorf("%d deleted instances kept, want %d", n, deletedKept)
	}
}

// TestListReadsDescriptionsInItsPipeline: a page of instances comes with their descriptions,
// which every listing shows, in its one pipeline: asking for one costs no round trip, while
// tags, which may be 64 KB, are read only when asked for.
func TestListReadsDescriptionsInItsPipeline(t *testing.T) {
	rdb := redisServer.Client(t)
	s := New(rdb)
	inst := newInstance("acme", "web", "a")
	inst.Description, inst.Tags = "shown in lists", []instance.Tag{{Name: "k", Value: "v"}}
	create(t, s, inst)
	page, err := s.List(ctx, "acme", "", "", 10)
	if err != nil || len(page) != 1 {
		t.Fatalf("list: %d, %v", len(page), err)
	}
	counter := &redistest.RoundTrips{}
	rdb.AddHook(counter)
	if l, err := page[0].Large(ctx, instance.FieldDescription); err != nil || l.Description != "shown in lists" || counter.N() != 0 {
		t.Errorf("description %q (%v) after %d round trips, want it with none", l.Description, err, counter.N())
	}
	if l, err := page[0].Large(ctx, instance.FieldTags); err != nil || len(l.Tags) != 1 || counter.N() != 1 {
		t.Errorf("tags %v (%v) after %d round trips, want them read with one", l.Tags, err, counter.N())
	}
}
