package logline

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
)

func TestWrite(t *testing.T) {
	var out bytes.Buffer
	// AddSource: a handler that would show the caller shows none, as no stack was unwound.
	log := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo, AddSource: true}))
	ctx := context.Background()

	Write(ctx, log, slog.LevelDebug, "hidden", slog.String("k", "v"))
	if out.Len() != 0 {
		t.Fatalf("a line below the handler's level was written: %s", out.String())
	}

	Write(ctx, log, slog.LevelInfo, "request", slog.String("path", "/graphql"), slog.Int("status", 200))
	var line map[string]any
	if err := json.Unmarshal(out.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if line["msg"] != "request" || line["level"] != "INFO" || line["path"] != "/graphql" || line["status"] != 200.0 || line["time"] == nil {
		t.Errorf("line %v: want the message, level, time and attributes", line)
	}
	if _, ok := line["source"]; ok {
		t.Errorf("line %v has a source: the caller was looked up", line)
	}
}
