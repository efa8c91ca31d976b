package server

import "testing"

// TestAcceptPreference: the answer's media type and the choice of an event stream follow the
// Accept header's q-values, then its order, case-insensitively; wildcards reach JSON but
// never an event stream, and q=0 refuses a type.
func TestAcceptPreference(t *testing.T) {
	tests := []struct {
		accept, answer string
		stream         bool
	}{
		{"", mediaJSON, false},
		{"application/json", mediaJSON, false},
		{"APPLICATION/JSON", mediaJSON, false},
		{"*/*", mediaJSON, false},
		{"application/*", mediaJSON, false},
		{"application/graphql-response+json, application/json;q=0.9", mediaGraphQLResponse, false},
		{"application/json, application/graphql-response+json", mediaJSON, false},
		{"application/json;q=0.1, application/graphql-response+json", mediaGraphQLResponse, false},
		{"application/graphql-response+json;q=0, application/json", mediaJSON, false},
		{"*/*;q=0.5, application/graphql-response+json", mediaGraphQLResponse, false},
		{"text/html", mediaGraphQLResponse, false},
		{"text/event-stream", mediaGraphQLResponse, true},
		{"Text/Event-Stream", mediaGraphQLResponse, true},
		{"text/event-stream, application/json", mediaJSON, true},
		{"application/json, text/event-stream", mediaJSON, false},
		{"application/json;q=0.5, text/event-stream", mediaJSON, true},
		{"text/event-stream;q=0.2, application/json", mediaJSON, false},
		{"text/event-stream;q=0", mediaGraphQLResponse, false},
		{"text/*", mediaGraphQLResponse, false},
		{"text/*, application/json;q=0.1", mediaJSON, false},
		{"application/json; charset=utf-8", mediaJSON, false},
		{"text/event-stream;q=-1, application/json", mediaJSON, false},
		{"text/event-stream;q=2, application/json", mediaJSON, false},
		{"text/event-stream;q=abc, application/json", mediaJSON, false},
		{"text/event-stream;q=1e-1, application/json;q=0.5", mediaJSON, false},
		{"text/event-stream;q=0.500, application/json;q=0.25", mediaJSON, true},
	}
	for _, tt := range tests {
		if got := responseType(tt.accept); got != tt.answer {
			t.Errorf("Accept %q: answer in %s, want %s", tt.accept, got, tt.answer)
		}
		if got := prefersEventStream(tt.accept); got != tt.stream {
			t.Errorf("Accept %q: event stream %v, want %v", tt.accept, got, tt.stream)
		}
	}
}
