// Package logtest records what code under test logs, so tests can assert on log records as on
// any other output.
package logtest

import (
	"context"
	"log/slog"
	"sync"
)

// Recorder is a slog.Handler that keeps every record's message and attributes, the values as
// text. Attributes added with WithAttrs or groups are not kept: the code under test logs flat
// records.
type Recorder struct {
	mu      sync.Mutex
	records []Record
}

// Record is one logged record.
type Record struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

// Logger returns a logger writing to r.
func (r *Recorder) Logger() *slog.Logger { return slog.New(r) }

func (*Recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *Recorder) WithAttrs([]slog.Attr) slog.Handler     { return r }
func (r *Recorder) WithGroup(string) slog.Handler          { return r }

func (r *Recorder) Handle(_ context.Context, rec slog.Record) error {
	out := Record{Level: rec.Level, Msg: rec.Message, Attrs: map[string]string{}}
	rec.Attrs(func(a slog.Attr) bool {
		out.Attrs[a.Key] = a.Value.String()
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, out)
	return nil
}

// Mark is how many records there are now, for Since.
func (r *Recorder) Mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.records)
}

// Since returns the records with message msg logged after mark.
func (r *Recorder) Since(mark int, msg string) []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Record
	for _, rec := range r.records[mark:] {
		if rec.Msg == msg {
			out = append(out, rec)
		}
	}
	return out
}
