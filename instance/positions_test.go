package instance_test

import (
	"strings"
	"testing"

	"github.com/computeql/computeql/instance"
)

func TestPositionLess(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want bool
	}{{"1-0", "2-0", true}, {"2-0", "1-9", false}, {"5-1", "5-2", true}, {"5-2", "5-2", false}, {"9-0", "10-0", true}, {"10-0", "9-99", false}} {
		if got := instance.PositionLess(tt.a, tt.b); got != tt.want {
			t.Errorf("PositionLess(%s, %s) = %v", tt.a, tt.b, got)
		}
	}
}

// TestMalformedIDIsEchoedWhole: a long id of multi-byte characters is cut at a character
// boundary in the error message, not into a byte escape of half a character.
func TestMalformedIDIsEchoedWhole(t *testing.T) {
	e := newEnv(t)
	_, err := e.svc.Get(acmeMember, "x"+strings.Repeat("é", 100)) // byte 64 falls inside a character
	if instance.CodeOf(err) != instance.CodeBadUserInput || strings.Contains(err.Error(), `\x`) {
		t.Errorf("err %v, want BAD_USER_INPUT without a split character", err)
	}
}
