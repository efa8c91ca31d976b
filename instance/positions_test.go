package instance_test

import (
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
