package server

import (
	"context"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// boundedCache is a least-recently-used cache bounded by the bytes it holds as well as by its
// entries: the caches of parsed documents and persisted queries are shared by every caller,
// and an entry count alone would let one tenant pin a thousand documents of a megabyte each.
// An entry heavier than a sixteenth of the budget is not cached at all: it is parsed again
// when sent again, at the cost of its own sender.
type boundedCache[T any] struct {
	mu       sync.Mutex
	lru      *simplelru.LRU[string, T]
	bytes    int
	maxBytes int
	weigh    func(key string, value T) int
}

func newBoundedCache[T any](entries, maxBytes int, weigh func(string, T) int) *boundedCache[T] {
	c := &boundedCache[T]{maxBytes: maxBytes, weigh: weigh}
	l, err := simplelru.NewLRU(entries, func(key string, value T) { c.bytes -= weigh(key, value) })
	if err != nil {
		panic(err) // only for a size that is not positive, a programming error
	}
	c.lru = l
	return c
}

func (c *boundedCache[T]) Get(_ context.Context, key string) (T, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Get(key)
}

func (c *boundedCache[T]) Add(_ context.Context, key string, value T) {
	w := c.weigh(key, value)
	if w > c.maxBytes/16 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.lru.Peek(key); ok {
		c.bytes -= c.weigh(key, old)
	}
	c.lru.Add(key, value)
	c.bytes += w
	for c.bytes > c.maxBytes {
		c.lru.RemoveOldest()
	}
}
