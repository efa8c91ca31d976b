package server

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestAnswersFollowGraphQLOverHTTP: every answer, refusals before execution included, comes
// in the media type the client accepts; a refusal before execution has no data entry, status
// 200 in application/json and 400 in application/graphql-response+json for a document that
// does not parse or validate, and its own status (401, 429) otherwise.
func TestAnswersFollowGraphQLOverHTTP(t *testing.T) {
	// Three requests of the principal pass; the fourth is over its limit.
	clock := newTestClock()
	a := newAPI(t, func(o *Options) { o.RateLimit, o.RateBurst, o.now = 1, 3, clock.now })
	tok := a.admin(t)
	tests := []struct {
		name, accept, token, query string
		status                     int
		media, code                string // code "" for an answer with data
	}{
		{"no token, graphql-response+json", "application/graphql-response+json, application/json;q=0.9", "", `{ me { subject } }`, http.StatusUnauthorized, mediaGraphQLResponse, "UNAUTHENTICATED"},
		{"no token, json", "application/json", "", `{ me { subject } }`, http.StatusUnauthorized, mediaJSON, "UNAUTHENTICATED"},
		{"no token, no Accept", "", "", `{ me { subject } }`, http.StatusUnauthorized, mediaJSON, "UNAUTHENTICATED"},
		{"bad token, graphql-response+json", mediaGraphQLResponse, "not-a-token", `{ me { subject } }`, http.StatusUnauthorized, mediaGraphQLResponse, "UNAUTHENTICATED"},
		{"parse error, graphql-response+json", mediaGraphQLResponse, tok, `{ me { subject }`, http.StatusBadRequest, mediaGraphQLResponse, "GRAPHQL_PARSE_FAILED"},
		{"validation error, json", mediaJSON, tok, `{ nope }`, http.StatusOK, mediaJSON, "GRAPHQL_VALIDATION_FAILED"},
		{"served, graphql-response+json", mediaGraphQLResponse, tok, `{ me { subject } }`, http.StatusOK, mediaGraphQLResponse, ""},
		{"rate limited, graphql-response+json", mediaGraphQLResponse, tok, `{ me { subject } }`, http.StatusTooManyRequests, mediaGraphQLResponse, "RATE_LIMITED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := postRequest(t, tt.query, nil)
			if tt.accept != "" {
				req.Header.Set("Accept", tt.accept)
			}
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			rec := a.serve(req)
			if rec.Code != tt.status || rec.Header().Get("Content-Type") != tt.media {
				t.Fatalf("status %d, %s; want %d, %s: %s", rec.Code, rec.Header().Get("Content-Type"), tt.status, tt.media, rec.Body)
			}
			var body map[string]json.RawMessage
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			_, hasData := body["data"]
			var errs []struct {
				Extensions struct{ Code string }
			}
			json.Unmarshal(body["errors"], &errs)
			switch {
			case tt.code == "" && (!hasData || len(errs) > 0):
				t.Errorf("want data and no errors: %s", rec.Body)
			case tt.code != "" && (hasData || len(errs) != 1 || errs[0].Extensions.Code != tt.code):
				t.Errorf("want only the error %s, and no data entry: %s", tt.code, rec.Body)
			}
		})
	}
}

// TestOtherMethodsAreRefusedWithACode: a method other than GET and POST is 405 with Allow and
// a code, where gqlgen alone says "transport not supported" without one.
func TestOtherMethodsAreRefusedWithACode(t *testing.T) {
	a := newAPI(t)
	req := postRequest(t, `{ me { subject } }`, nil)
	req.Method = http.MethodPut
	res := a.send(t, a.admin(t), req)
	wantError(t, res, http.StatusMethodNotAllowed, "BAD_USER_INPUT")
	if allow := res.Header.Get("Allow"); allow != "GET, POST" {
		t.Errorf("Allow %q, want GET, POST", allow)
	}
}
