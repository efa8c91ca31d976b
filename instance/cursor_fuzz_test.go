package instance

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// maxRefusal bounds the message of a refused id or cursor: the input is echoed truncated
// (64 bytes, each quoted as at most 10 characters), never whole.
const maxRefusal = 1024

// wantBadInput fails unless err is a BAD_USER_INPUT *Error with a bounded message.
func wantBadInput(t *testing.T, input string, err error) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeBadUserInput || len(e.Message) > maxRefusal {
		t.Fatalf("%q refused with %v, want a %s of at most %d bytes", input, err, CodeBadUserInput, maxRefusal)
	}
}

// FuzzInstanceID: an accepted instance id is a UUID in its hyphenated form, canonical but for
// case (an upper-case id is well formed and finds nothing, as every stored id is lower
// case), and the listing cursor of the canonical id decodes back to it.
func FuzzInstanceID(f *testing.F) {
	for _, s := range []string{
		"0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f", "0190C7A4-6B1E-7C3D-9F00-1A2B3C4D5E6F", "00000000-0000-0000-0000-000000000000",
		"{0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f}", "urn:uuid:0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f", "0190c7a46b1e7c3d9f001a2b3c4d5e6f",
		"0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6", "", "x", strings.Repeat("\xff", 200),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if err := checkID(id); err != nil {
			wantBadInput(t, id, err)
			return
		}
		u, err := uuid.Parse(id)
		if err != nil || u.String() != strings.ToLower(id) {
			t.Fatalf("accepted id %q is not a hyphenated UUID (%v)", id, err)
		}
		if back, err := decodeCursor(Cursor(&Instance{ID: u.String()})); err != nil || back != u.String() {
			t.Fatalf("cursor of %q decodes to %q, %v", u, back, err)
		}
	})
}

// FuzzListCursor: a listing cursor that decodes names a canonical instance id and is the
// very cursor that instance would be given, so no two cursors name one position.
func FuzzListCursor(f *testing.F) {
	id := "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f"
	good := Cursor(&Instance{ID: id})
	for _, s := range []string{
		good, good + "\n", good[:len(good)-1] + "h", Cursor(&Instance{ID: strings.ToUpper(id)}), Cursor(&Instance{ID: "not-an-id"}),
		EventCursor(Record{Cursor: "1-0"}), "aTE6", "", "====", "i1:" + id, strings.Repeat("A", 500),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, c string) {
		id, err := decodeCursor(c)
		if err != nil {
			wantBadInput(t, c, err)
			return
		}
		if u, err := uuid.Parse(id); err != nil || u.String() != id {
			t.Fatalf("cursor %q names %q, not a canonical instance id (%v)", c, id, err)
		}
		if again := Cursor(&Instance{ID: id}); again != c {
			t.Fatalf("cursor %q decodes to %q, whose cursor is %q", c, id, again)
		}
	})
}

// FuzzEventCursor: an event cursor that decodes names a Redis stream position with both
// parts in uint64 and written canonically, and is the very cursor that position is given;
// a position Redis would refuse would surface as an internal error, not a bad cursor.
func FuzzEventCursor(f *testing.F) {
	good := EventCursor(Record{Cursor: "1732190400000-3"})
	for _, s := range []string{
		good, good + "\r\n", good[:len(good)-1] + "x", EventCursor(Record{Cursor: "0-0"}), EventCursor(Record{Cursor: "18446744073709551615-18446744073709551615"}),
		EventCursor(Record{Cursor: "18446744073709551616-0"}), EventCursor(Record{Cursor: "99999999999999999999-0"}),
		EventCursor(Record{Cursor: "01-0"}), EventCursor(Record{Cursor: "1-"}), EventCursor(Record{Cursor: "+1-0"}),
		EventCursor(Record{Cursor: "1"}), Cursor(&Instance{ID: "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f"}), "", "ZTE6",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, c string) {
		pos, err := DecodeEventCursor(c)
		if err != nil {
			wantBadInput(t, c, err)
			return
		}
		msText, seqText, _ := strings.Cut(pos, "-")
		ms, errMS := strconv.ParseUint(msText, 10, 64)
		seq, errSeq := strconv.ParseUint(seqText, 10, 64)
		if errMS != nil || errSeq != nil || strconv.FormatUint(ms, 10)+"-"+strconv.FormatUint(seq, 10) != pos {
			t.Fatalf("cursor %q names %q, not a canonical stream position (%v, %v)", c, pos, errMS, errSeq)
		}
		if again := EventCursor(Record{Cursor: pos}); again != c {
			t.Fatalf("cursor %q decodes to %q, whose cursor is %q", c, pos, again)
		}
		if PositionLess(pos, pos) || (pos != "0-0") != PositionLess("0-0", pos) {
			t.Fatalf("PositionLess misorders %q against itself or 0-0", pos)
		}
	})
}
