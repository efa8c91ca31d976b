package region_test

import (
	"testing"
	"time"

	"github.com/computeql/computeql/region"
)

// TestTailText: the tail is at most the bytes asked for, drops a character its start would
// cut instead of garbling it, replaces invalid UTF-8, and says whether anything came before.
func TestTailText(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("CET", 3600))
	for _, tc := range []struct {
		name      string
		out       string
		tail      int
		want      string
		truncated bool
	}{
		{"all of it", "boot\nlogin: ", 64, "boot\nlogin: ", false},
		{"the end", "boot\nlogin: ", 7, "login: ", true},
		{"a character cut by the start is dropped", "ab€cd", 4, "cd", true}, // € is 3 bytes: its last 2 fall in the tail
		{"a character that fits whole", "ab€cd", 5, "€cd", true},
		{"invalid bytes replaced", "ok\xffok", 64, "ok\uFFFDok", false},
		{"nothing", "", 10, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := region.TailText([]byte(tc.out), tc.tail, at)
			if got.Text != tc.want || got.Truncated != tc.truncated || !got.CapturedAt.Equal(at) || got.CapturedAt.Location() != time.UTC {
				t.Errorf("TailText(%q, %d) = %q truncated %t at %s; want %q truncated %t at %s UTC", tc.out, tc.tail,
					got.Text, got.Truncated, got.CapturedAt, tc.want, tc.truncated, at.UTC())
			}
		})
	}
}
