package instance

import (
	"context"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"

	"github.com/computeql/computeql/auth"
)

// HistoryPage is one page of an instance's history.
type HistoryPage struct {
	Events      []Record
	HasNextPage bool
}

// EventCursor returns the opaque cursor of a history event.
func EventCursor(r Record) string {
	return base64.RawURLEncoding.EncodeToString([]byte("e1:" + r.Cursor))
}

// DecodeEventCursor returns the log position an event cursor names. It accepts only cursors
// as EventCursor writes them: the base64 decoder alone also reads them with line breaks or
// stray low bits.
func DecodeEventCursor(c string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	pos, ok := strings.CutPrefix(string(b), "e1:")
	if err != nil || !ok || !validStreamID(pos) || base64.RawURLEncoding.EncodeToString(b) != c {
		return "", Errorf(CodeBadUserInput, "after: %q is not a cursor of this history", truncate(c, 64))
	}
	return pos, nil
}

// SnapshotCursor returns the cursor of a SNAPSHOT event: the position the subscription went
// live at, and the id of the instance the event carries. A subscription resumed after it
// replays what changed since that position for the instances already sent (whose ids sort at
// or before it: a snapshot goes in id order), and continues the snapshot after it.
func SnapshotCursor(pos, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte("s1:" + pos + "," + id))
}

// DecodeSubscriptionCursor reads the cursor a subscription resumes after: an event's (snapshotAfter
// empty) or a SNAPSHOT event's.
func DecodeSubscriptionCursor(c string) (pos, snapshotAfter string, err error) {
	b, derr := base64.RawURLEncoding.DecodeString(c)
	if body, ok := strings.CutPrefix(string(b), "s1:"); ok && derr == nil && base64.RawURLEncoding.EncodeToString(b) == c {
		pos, id, ok := strings.Cut(body, ",")
		if ok && validStreamID(pos) && checkID(id) == nil && id == strings.ToLower(id) {
			return pos, id, nil
		}
	}
	if pos, err = DecodeEventCursor(c); err != nil {
		return "", "", err
	}
	return pos, "", nil
}

// validStreamID accepts "<ms>-<seq>" as Redis writes stream ids: both parts unsigned 64-bit
// decimals without leading zeros. Redis refuses larger parts, which would surface as an
// internal error, and PositionLess could not order them.
func validStreamID(s string) bool {
	ms, seq, ok := strings.Cut(s, "-")
	isNum := func(p string) bool {
		n, err := strconv.ParseUint(p, 10, 64)
		return err == nil && strconv.FormatUint(n, 10) == p
	}
	return ok && isNum(ms) && isNum(seq)
}

// PositionLess reports whether log position a ("<ms>-<seq>", as Redis stream ids are) comes
// before b.
func PositionLess(a, b string) bool {
	parse := func(id string) (uint64, uint64) {
		ms, seq, _ := strings.Cut(id, "-")
		x, _ := strconv.ParseUint(ms, 10, 64)
		y, _ := strconv.ParseUint(seq, 10, 64)
		return x, y
	}
	am, as := parse(a)
	bm, bs := parse(b)
	return am < bm || am == bm && as < bs
}

// History returns a page of an instance's history, oldest first, to anyone who may read the
// instance, or could before it was deleted. The history is kept as long as the organization's
// event log keeps it, and after a deletion for the organization's deletedKept most recently
// deleted instances (the store's bound).
func (s *Service) History(ctx context.Context, id string, first *int, after *string) (*HistoryPage, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, err
	}
	org, err := s.historyOf(ctx, pr, id)
	if err != nil {
		return nil, err
	}
	n := DefaultPageSize
	if first != nil {
		n = *first
	}
	if n < 1 || n > MaxPageSize {
		return nil, Errorf(CodeBadUserInput, "first must be between 1 and %d", MaxPageSize)
	}
	pos := ""
	if after != nil && *after != "" {
		if pos, err = DecodeEventCursor(*after); err != nil {
			return nil, err
		}
	}
	events, more, err := s.store.History(ctx, org, id, pos, n)
	switch {
	case errors.Is(err, ErrCursorExpired):
		return nil, Errorf(CodeCursorExpired, "the history no longer reaches back to that cursor: read it again from the start")
	case err != nil:
		return nil, internal("instance history", err)
	}
	return &HistoryPage{Events: events, HasNextPage: more}, nil
}

// historyOf returns the organization of the instance whose history the principal asks for: a
// live one it may read, or a deleted one of a project it may read. Any other answers as one
// that does not exist.
func (s *Service) historyOf(ctx context.Context, pr auth.Principal, id string) (string, error) {
	inst, err := s.peek(ctx, pr, id, auth.RoleViewer)
	if err == nil {
		return inst.OrganizationID, nil
	}
	if e := (*Error)(nil); !errors.As(err, &e) || e.Code != CodeNotFound || checkID(id) != nil {
		return "", err
	}
	org, project, derr := s.store.Deleted(ctx, pr.Organizations(), id)
	switch {
	case derr == ErrNotFound:
		return "", err
	case derr != nil:
		return "", internal("deleted instance", derr)
	case !pr.Allows(org, project, auth.RoleViewer):
		return "", err
	}
	return org, nil
}
