package libvirt

import (
	"errors"
	"strconv"
	"sync"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/computeql/computeql/region"
)

// indexed is what the index keeps of a server: what never changes after it is made.
type indexed struct {
	id    string
	scope region.Scope
	tags  map[string]string
	// mac and network find the server's address reservation once its domain is gone; ip is
	// the address, which no other host of the region may hand out.
	mac, network, ip string
}

// index finds servers by tag without asking the host about every domain.
type index struct {
	mu    sync.RWMutex
	byID  map[string]indexed
	byTag map[string]map[string]bool // "tag=value" → server ids
}

func newIndex() *index {
	return &index{byID: map[string]indexed{}, byTag: map[string]map[string]bool{}}
}

// replace makes the index hold exactly the servers, and returns those it held that are gone.
func (x *index) replace(servers []indexed) (gone []indexed) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.byID
	x.byID, x.byTag = map[string]indexed{}, map[string]map[string]bool{}
	for _, s := range servers {
		x.addLocked(s)
	}
	for id, s := range old {
		if _, ok := x.byID[id]; !ok {
			gone = append(gone, s)
		}
	}
	return gone
}

func (x *index) add(s indexed) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.addLocked(s)
}

func (x *index) addLocked(s indexed) {
	x.removeLocked(s.id)
	x.byID[s.id] = s
	for k, v := range s.tags {
		set := x.byTag[k+"="+v]
		if set == nil {
			set = map[string]bool{}
			x.byTag[k+"="+v] = set
		}
		set[s.id] = true
	}
}

// remove forgets a server and returns what was known of it.
func (x *index) remove(id string) (indexed, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.removeLocked(id)
}

func (x *index) removeLocked(id string) (indexed, bool) {
	s, ok := x.byID[id]
	if !ok {
		return indexed{}, false
	}
	delete(x.byID, id)
	for k, v := range s.tags {
		delete(x.byTag[k+"="+v], id)
		if len(x.byTag[k+"="+v]) == 0 {
			delete(x.byTag, k+"="+v)
		}
	}
	return s, true
}

func (x *index) get(id string) (indexed, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	s, ok := x.byID[id]
	return s, ok
}

func (x *index) find(scope region.Scope, tag, value string) []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var ids []string
	for id := range x.byTag[tag+"="+value] {
		if x.byID[id].scope == scope {
			ids = append(ids, id)
		}
	}
	return ids
}

// tagged reports whether a server of any scope carries the tag with the value.
func (x *index) tagged(tag, value string) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.byTag[tag+"="+value]) > 0
}

// all returns every indexed server.
func (x *index) all() []indexed {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make([]indexed, 0, len(x.byID))
	for _, s := range x.byID {
		out = append(out, s)
	}
	return out
}

// lifecycle keeps the index current from one of the host's events and passes it on to
// watchers as a server event. Domains without computeql's metadata are not servers.
func (d *hostDriver) lifecycle(conn *golibvirt.Libvirt, ev golibvirt.DomainEventLifecycleMsg) {
	id := uuidString(ev.Dom.UUID)
	kind := region.ServerUpdated
	var s indexed
	switch golibvirt.DomainEventType(ev.Event) {
	case golibvirt.DomainEventUndefined:
		var ok bool
		if s, ok = d.index.remove(id); !ok {
			return
		}
		d.release(conn, s)
		kind = region.ServerDeleted
	case golibvirt.DomainEventDefined:
		srv, err := readServer(conn, ev.Dom)
		if err != nil {
			if !errors.Is(err, errNotOurs) {
				d.log.Warn("read a defined domain", "domain", ev.Dom.Name, "err", err)
			}
			return
		}
		if srv.rec.Spec.RegionID != d.opts.Region.ID {
			return // another region's server on a shared host
		}
		s = srv.indexed()
		d.index.add(s)
		kind = region.ServerCreated
	default:
		var ok bool
		if s, ok = d.index.get(id); !ok {
			return
		}
	}
	d.watches.publish(region.Event{Kind: kind, ServerID: s.id, Scope: s.scope, Tags: s.tags})
}

// release frees what a server whose domain is gone still holds: its volumes and its address
// reservation. A delete of ours freed them already; a domain undefined behind our back (or
// while we were away) did not, and its address would otherwise never be handed out again.
func (d *hostDriver) release(conn *golibvirt.Libvirt, s indexed) {
	d.mu.RLock()
	pool := d.pool
	d.mu.RUnlock()
	volumes := []string{namePrefix + s.id + ".qcow2", overlayName(s.id), namePrefix + s.id + "-seed.iso", consoleLogName(s.id)}
	if err := errors.Join(deleteVolumes(conn, pool, volumes), release(conn, s.network, s.mac), undefineFilter(conn, s.id)); err != nil {
		d.log.Warn("free what a deleted server held", "server", s.id, "err", err)
	}
}

// broadcaster hands every server event to every watch.
type broadcaster struct {
	mu   sync.Mutex
	seq  uint64
	subs map[chan region.Event]struct{}
}

func newBroadcaster() *broadcaster {
	return &broadcaster{subs: map[chan region.Event]struct{}{}}
}

// watchBuffer is how many events a watch may fall behind before it is ended; its watcher
// then watches again, and a watch that resumes starts by looking at every server.
const watchBuffer = 1024

func (b *broadcaster) publish(ev region.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	ev.Cursor = strconv.FormatUint(b.seq, 10)
	for ch := range b.subs {
		select {
		case ch <- ev:
		default:
			delete(b.subs, ch)
			close(ch)
		}
	}
}

func (b *broadcaster) subscribe() chan region.Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan region.Event, watchBuffer)
	b.subs[ch] = struct{}{}
	return ch
}

func (b *broadcaster) unsubscribe(ch chan region.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.subs[ch]; ok {
		delete(b.subs, ch)
		close(ch)
	}
}

// idSet is a set of server ids safe for concurrent use.
type idSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (s *idSet) add(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil {
		s.ids = map[string]bool{}
	}
	s.ids[id] = true
}

func (s *idSet) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ids, id)
}

func (s *idSet) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.ids))
	for id := range s.ids {
		out = append(out, id)
	}
	return out
}
