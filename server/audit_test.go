package server

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// logRecorder is a slog.Handler that keeps every record's message and attributes as text, for
// tests of what the server logs.
type logRecorder struct {
	mu      sync.Mutex
	records []loggedRecord
}

type loggedRecord struct {
	msg   string
	attrs map[string]string
}

func (*logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler     { return l }
func (l *logRecorder) WithGroup(string) slog.Handler          { return l }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := loggedRecord{msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, rec)
	return nil
}

// mark is how many records there are now; since(mark, msg) returns those with msg after it.
func (l *logRecorder) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.records)
}

func (l *logRecorder) since(mark int, msg string) []loggedRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []loggedRecord
	for _, r := range l.records[mark:] {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

// checkAudit checks what one mutation call of the authorization matrix logged: nothing when
// authentication refused it (it never ran), else exactly one audit record naming the
// mutation, the caller's subject, the id or organization it named, and the outcome the
// caller got: "ok", the top-level error's code, or the first userError's code.
func checkAudit(tb testing.TB, records []loggedRecord, field, subject, outcome string, vars map[string]any) {
	tb.Helper()
	if outcome == authzUnauthenticated {
		if len(records) != 0 {
			tb.Errorf("an unauthenticated call was audited: %v", records)
		}
		return
	}
	if len(records) != 1 {
		tb.Fatalf("%d audit records, want 1: %v", len(records), records)
	}
	got := records[0].attrs
	_, mutation, _ := strings.Cut(field, ".")
	want := strings.TrimSuffix(strings.TrimPrefix(outcome, "userErrors["), "]")
	if outcome == authzOK {
		want = "ok"
	}
	if got["mutation"] != mutation || got["subject"] != subject || got["outcome"] != want {
		tb.Errorf("audit %v, want mutation %s subject %s outcome %s", got, mutation, subject, want)
	}
	switch {
	case vars["id"] != nil:
		if got["target"] != vars["id"] {
			tb.Errorf("audit target %q, want %v", got["target"], vars["id"])
		}
	case mutation == "setQuota":
		if got["target"] != "acme" {
			tb.Errorf("audit target %q, want acme", got["target"])
		}
	case mutation == "createInstance":
		if (got["target"] != "") != (outcome == authzOK) || got["organization"] != "acme" || got["project"] != "web" {
			tb.Errorf("create audited as %v: a target only when created, and its organization and project", got)
		}
	}
}
