package app

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestOTLPEndpointFlag: under --otlp-endpoint a run sends its spans to the collector over
// OTLP/HTTP, all of them by the time it has stopped; a malformed endpoint stops it at start.
func TestOTLPEndpointFlag(t *testing.T) {
	var mu sync.Mutex
	var exported []byte
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" {
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		exported = append(exported, body...)
		mu.Unlock()
	}))
	defer collector.Close()

	e := runEmbedded(t, "--otlp-endpoint", collector.URL)
	if got := e.post(t, `query Me { me { subject } }`); !strings.Contains(got, `"subject":"demo-admin"`) {
		t.Fatalf("query answered %s", got)
	}
	e.cancel()
	select {
	case err := <-e.done:
		e.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("did not shut down")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{"query Me", "computeql.role"} {
		if !bytes.Contains(exported, []byte(want)) {
			t.Errorf("the collector received no %q", want)
		}
	}

	err := Run(context.Background(), []string{"--listen", "127.0.0.1:0", "--otlp-endpoint", "otel-collector:4318"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "OTLP endpoint") {
		t.Errorf("run with a malformed endpoint: %v, want an error naming it", err)
	}
}
