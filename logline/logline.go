// Package logline writes the log lines of every request: the request line and the audit line.
//
// slog's Logger takes its caller's program counter for every record, by unwinding the stack,
// whether or not a handler will show the source; for two lines per request that unwinding was
// a tenth of what logging cost the API. A line written here carries no source.
package logline

import (
	"context"
	"log/slog"
	"time"
)

// Write logs msg with attrs at level, as log.LogAttrs does, without the caller's source.
func Write(ctx context.Context, log *slog.Logger, level slog.Level, msg string, attrs ...slog.Attr) {
	h := log.Handler()
	if !h.Enabled(ctx, level) {
		return
	}
	r := slog.NewRecord(time.Now(), level, msg, 0)
	r.AddAttrs(attrs...)
	_ = h.Handle(ctx, r) // as slog.Logger does: a handler's error has nowhere to go
}
