package instance

import (
	"context"
	"sync"
)

// LargeFields are the parts of a spec that may be large: at their limits tens of kilobytes,
// many times the rest of an instance. The event log never copies them, so that an event costs
// the store a few kilobytes whatever the instance holds; an instance read from the log gets
// them from the instance as it is now.
type LargeFields struct {
	Description string `json:"description,omitempty"`
	Tags        []Tag  `json:"tags,omitempty"`
	UserData    []byte `json:"userData,omitempty"`
}

// LargeFieldNames are the names of the LargeFields in changed-field lists and the API.
var LargeFieldNames = []string{"description", "tags", "userData"}

// SplitLarge returns the spec without its large fields, and those fields.
func SplitLarge(spec Spec) (Spec, LargeFields) {
	large := LargeFields{Description: spec.Description, Tags: spec.Tags, UserData: spec.UserData}
	spec.Description, spec.Tags, spec.UserData = "", nil, nil
	return spec, large
}

// SetLarge puts the large fields into the spec.
func (s *Spec) SetLarge(l LargeFields) {
	s.Description, s.Tags, s.UserData = l.Description, l.Tags, l.UserData
}

// LargeLoader reads the current large fields of an instance; ok is false when it is gone.
type LargeLoader func(ctx context.Context) (l LargeFields, ok bool, err error)

// lazyLarge loads the large fields once for every holder of an instance read from the log:
// one event is shared by all the subscribers it is fanned out to.
type lazyLarge struct {
	load LargeLoader
	once sync.Once
	val  LargeFields
	err  error
}

// LoadLargeWith marks the instance as read from the event log, without its large fields:
// Large reads them with load, once.
func (i *Instance) LoadLargeWith(load LargeLoader) {
	i.large = &lazyLarge{load: load}
}

// FromLog reports whether the instance was read from the event log, so that its large fields
// are the instance's current ones rather than those as of the event.
func (i *Instance) FromLog() bool { return i.large != nil }

// Large returns the instance's large fields: its own, or for one read from the event log the
// instance's current ones (empty once it is deleted).
func (i *Instance) Large(ctx context.Context) (LargeFields, error) {
	if i.large == nil {
		return LargeFields{Description: i.Description, Tags: i.Tags, UserData: i.UserData}, nil
	}
	l := i.large
	l.once.Do(func() {
		if l.val, _, l.err = l.load(ctx); l.err != nil {
			l.err = internal("read an instance's large fields", l.err)
		}
	})
	return l.val, l.err
}
