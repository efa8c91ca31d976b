package server

import (
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/redistest"
)

const consoleOutputDoc = `query($id: ID!, $tail: Int) { instanceConsoleOutput(id: $id, tailBytes: $tail) { text truncated capturedAt } }`

type consoleOutput struct {
	Text       string    `json:"text"`
	Truncated  bool      `json:"truncated"`
	CapturedAt time.Time `json:"capturedAt"`
}

// TestConsoleOutput: an operator reads the end of a running server's boot log, whole or its
// last tailBytes (then truncated); tailBytes outside 1 to 65536 is BAD_USER_INPUT; reading
// it writes nothing, not even history.
func TestConsoleOutput(t *testing.T) {
	a, s := wsServer(t)
	clock := a.realise(t)
	admin := a.admin(t)
	op := a.operator(t)
	c := subscribeWS(t, s, protoTransportWS, admin, resizeSubQuery)
	id := a.mustCreate(t, admin, createInput("booted")).ID
	awaitResize(c, "the instance running", settled(id, "g1.small", "RUNNING"))
	clock.stopWorkers()

	before := redistest.State(t, a.rdb)
	read := func(tail any) consoleOutput {
		t.Helper()
		var out consoleOutput
		decode(t, a.mustPost(t, op, consoleOutputDoc, map[string]any{"id": id, "tail": tail}).Data["instanceConsoleOutput"], &out)
		return out
	}
	whole := read(nil)
	if !strings.Contains(whole.Text, "booted login:") || whole.Truncated {
		t.Errorf("the whole console %+v, want the boot log up to the login prompt, not truncated", whole)
	}
	if time.Since(whole.CapturedAt) > time.Minute || time.Until(whole.CapturedAt) > time.Second {
		t.Errorf("captured at %s, want now", whole.CapturedAt)
	}
	tail := read(20)
	if !tail.Truncated || tail.Text != whole.Text[len(whole.Text)-20:] {
		t.Errorf("the last 20 bytes %+v, want %q, truncated", tail, whole.Text[len(whole.Text)-20:])
	}
	for _, bad := range []int{0, -1, 65537} {
		wantError(t, a.post(t, op, consoleOutputDoc, map[string]any{"id": id, "tail": bad}), http.StatusOK, "BAD_USER_INPUT")
	}
	if !maps.Equal(before, redistest.State(t, a.rdb)) {
		t.Error("reading the console output changed Redis")
	}
}
