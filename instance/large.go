package instance

import (
	"context"
	"sync"
)

// LargeFields are the parts of a spec that may be large: at their limits tens of kilobytes,
// many times the rest of an instance. The event log never copies them, so that an event costs
// the store a few kilobytes whatever the instance holds; an instance read from the log gets
// them from the instance as it is now. Reads that serve the API (a page of instances, one
// instance, a history page) do not read them either until a caller asks for one.
type LargeFields struct {
	Description string
	Tags        []Tag
	UserData    []byte
}

// LargeField names one of the LargeFields.
type LargeField int

// The large fields.
const (
	FieldDescription LargeField = iota
	FieldTags
	FieldUserData
	largeFieldCount
)

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

// LargeLoader reads one of the current large fields of an instance into that field of l,
// and sets no other; it leaves l as it is when the instance is gone.
type LargeLoader func(ctx context.Context, field LargeField, l *LargeFields) error

// lazyLarge loads each large field once for every holder of an instance read without them:
// one event is shared by all the subscribers it is fanned out to.
type lazyLarge struct {
	load LargeLoader
	once [largeFieldCount]sync.Once
	errs [largeFieldCount]error
	val  LargeFields
}

// LoadLargeWith marks the instance as read without its large fields but those in read, which
// it holds: Large reads each of the others with load, once, when asked for.
func (i *Instance) LoadLargeWith(load LargeLoader, read ...LargeField) {
	l := &lazyLarge{load: load}
	held := LargeFields{Description: i.Description, Tags: i.Tags, UserData: i.UserData}
	for _, f := range read {
		l.once[f].Do(func() { copyField(&l.val, f, &held) })
	}
	i.large = l
}

// Partial reports whether the instance was read without its large fields, which Large then
// reads on demand: for an instance read from the event log, the instance's current ones
// rather than those as of the event.
func (i *Instance) Partial() bool { return i.large != nil }

// Large returns the instance's large field, the others left empty: its own, or for an
// instance read without it, the instance's current one (empty once it is deleted).
func (i *Instance) Large(ctx context.Context, field LargeField) (LargeFields, error) {
	l := i.large
	if l == nil {
		return pick(field, &LargeFields{Description: i.Description, Tags: i.Tags, UserData: i.UserData}), nil
	}
	l.once[field].Do(func() {
		if err := l.load(ctx, field, &l.val); err != nil {
			l.errs[field] = internal("read an instance's large fields", err)
		}
	})
	if l.errs[field] != nil {
		return LargeFields{}, l.errs[field]
	}
	return pick(field, &l.val), nil
}

// pick returns the one field of from, the others left empty.
func pick(field LargeField, from *LargeFields) LargeFields {
	var out LargeFields
	copyField(&out, field, from)
	return out
}

// copyField copies the one field, reading no other: another may be being loaded meanwhile.
func copyField(into *LargeFields, field LargeField, from *LargeFields) {
	switch field {
	case FieldDescription:
		into.Description = from.Description
	case FieldTags:
		into.Tags = from.Tags
	default:
		into.UserData = from.UserData
	}
}
