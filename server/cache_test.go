package server

import (
	"context"
	"strings"
	"testing"
)

// TestBoundedCacheHoldsItsBytes: the cache evicts the least recently used entries to stay
// within its bytes, whatever their count; an entry over a sixteenth of the budget is never
// cached; replacing an entry counts its new weight, not both.
func TestBoundedCacheHoldsItsBytes(t *testing.T) {
	ctx := context.Background()
	c := newBoundedCache(1000, 1600, func(k, v string) int { return len(k) + len(v) })
	value := func(n int) string { return strings.Repeat("v", n) }
	for _, k := range []string{"a", "b", "c"} {
		c.Add(ctx, k, value(99)) // 100 bytes each
	}
	if _, ok := c.Get(ctx, "a"); !ok { // a is now the most recently used
		t.Fatal("a was not cached")
	}
	c.Add(ctx, "heavy", value(96)) // 101 bytes: over 1600/16
	if _, ok := c.Get(ctx, "heavy"); ok {
		t.Error("an entry over a sixteenth of the budget was cached")
	}
	for i := range 13 { // 13 more entries of 100 bytes: 1,600 in all, then two over
		c.Add(ctx, strings.Repeat("k", 2)+string(rune('a'+i)), value(97))
	}
	if c.bytes != 1600 {
		t.Errorf("holds %d bytes, want 1600", c.bytes)
	}
	c.Add(ctx, "kz", value(98))
	if c.bytes > 1600 {
		t.Errorf("holds %d bytes over a budget of 1600", c.bytes)
	}
	if _, ok := c.Get(ctx, "b"); ok {
		t.Error("b, the least recently used, was kept past the budget")
	}
	if _, ok := c.Get(ctx, "a"); !ok {
		t.Error("a, used since, was evicted before b and c")
	}
	before := c.bytes
	c.Add(ctx, "a", value(49))
	if c.bytes != before-50 {
		t.Errorf("replacing an entry: %d bytes, want %d", c.bytes, before-50)
	}
	// Replaced under budget, the old entry's weight goes: nothing else need be evicted.
	c.Add(ctx, "a", value(99))
	if _, ok := c.Get(ctx, "c"); !ok || c.bytes != before {
		t.Errorf("replacing an entry under budget: c, the least recently used, kept %v, %d bytes, want kept and %d", ok, c.bytes, before)
	}
	// The entry count bounds it too.
	few := newBoundedCache(2, 1<<20, func(k, v string) int { return len(k) + len(v) })
	for _, k := range []string{"x", "y", "z"} {
		few.Add(ctx, k, "1")
	}
	if _, ok := few.Get(ctx, "x"); ok || few.bytes != 4 {
		t.Errorf("two entries at most: x kept %v, %d bytes", ok, few.bytes)
	}
}
