package server

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestMalformedOperationsAreRefusedWithGraphQLCodes: documents and variables that do not
// parse or validate are refused before any resolver runs, over POST and GET alike, with
// gqlgen's codes, status 200 in application/json as the GraphQL-over-HTTP specification
// says, and no data entry.
func TestMalformedOperationsAreRefusedWithGraphQLCodes(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	const list = `query($f: InstanceFilter, $first: Int) { instances(organizationId: "acme", filter: $f, first: $first) { totalCount } }`
	const get = `query($id: ID!) { instance(id: $id) { id } }`
	tests := []struct {
		name  string
		query string
		vars  map[string]any
		code  string
	}{
		{"unknown enum value inline", `{ instances(organizationId: "acme", filter: {powerState: [FLYING]}) { totalCount } }`, nil, "GRAPHQL_VALIDATION_FAILED"},
		{"enum value as a string inline", `{ instances(organizationId: "acme", filter: {powerState: ["RUNNING"]}) { totalCount } }`, nil, "GRAPHQL_VALIDATION_FAILED"},
		{"unknown enum value in variables", list, map[string]any{"f": map[string]any{"powerState": []string{"FLYING"}}}, "GRAPHQL_VALIDATION_FAILED"},
		{"string for an Int variable", list, map[string]any{"first": "ten"}, "GRAPHQL_VALIDATION_FAILED"},
		{"float for an Int variable", list, map[string]any{"first": 1.5}, "GRAPHQL_VALIDATION_FAILED"},
		{"object for an ID variable", get, map[string]any{"id": map[string]any{"$ne": ""}}, "GRAPHQL_VALIDATION_FAILED"},
		{"unknown field in an input object variable", list, map[string]any{"f": map[string]any{"owner": "me"}}, "GRAPHQL_VALIDATION_FAILED"},
		{"null for a non-null variable", get, map[string]any{"id": nil}, "GRAPHQL_VALIDATION_FAILED"},
		{"missing required variable", get, nil, "GRAPHQL_VALIDATION_FAILED"},
		{"variable of the wrong declared type", `query($f: String) { instances(organizationId: "acme", first: $f) { totalCount } }`, map[string]any{"f": "1"}, "GRAPHQL_VALIDATION_FAILED"},
		{"missing required argument", `{ instance { id } }`, nil, "GRAPHQL_VALIDATION_FAILED"},
		{"missing required input field", `mutation { deleteInstance(input: {}) { userErrors { code } } }`, nil, "GRAPHQL_VALIDATION_FAILED"},
		{"unknown argument", `{ instance(id: "x", force: true) { id } }`, nil, "GRAPHQL_VALIDATION_FAILED"},
		{"unknown field", `{ me { password } }`, nil, "GRAPHQL_VALIDATION_FAILED"},
		{"object without a selection", `{ me }`, nil, "GRAPHQL_VALIDATION_FAILED"},
		{"unknown directive", `{ me @cached { subject } }`, nil, "GRAPHQL_VALIDATION_FAILED"},
		{"fragment cycle", `{ ...A } fragment A on Query { ...B } fragment B on Query { ...A }`, nil, "GRAPHQL_VALIDATION_FAILED"},
		{"unknown operation type", `{ __type(name: "Query") { name } } subscription { nope }`, nil, "GRAPHQL_VALIDATION_FAILED"},
		{"empty document", ``, nil, "GRAPHQL_VALIDATION_FAILED"},
		{"syntax error", `{ me { subject }`, nil, "GRAPHQL_PARSE_FAILED"},
		{"unterminated string", `{ instance(id: "abc) { id } }`, nil, "GRAPHQL_PARSE_FAILED"},
		{"stray characters", `{ me { subject } } }}}`, nil, "GRAPHQL_PARSE_FAILED"},
		{"not GraphQL at all", `SELECT * FROM instances`, nil, "GRAPHQL_PARSE_FAILED"},
		{"comment only", `# nothing here`, nil, "GRAPHQL_VALIDATION_FAILED"},
	}
	for _, tt := range tests {
		for _, send := range []struct {
			method string
			do     func(testing.TB, string, string, map[string]any) *gqlResponse
		}{{http.MethodPost, a.post}, {http.MethodGet, a.get}} {
			t.Run(send.method+" "+tt.name, func(t *testing.T) {
				res := send.do(t, tok, tt.query, tt.vars)
				if res.Status != http.StatusOK {
					t.Errorf("status = %d, want 200; body %s", res.Status, res.Raw)
				}
				codes := res.codes()
				if len(codes) == 0 {
					t.Fatalf("no error: %s", res.Raw)
				}
				for _, c := range codes {
					if c != tt.code {
						t.Errorf("codes = %q, want all %s; body %s", codes, tt.code, res.Raw)
						break
					}
				}
				var body map[string]json.RawMessage
				if err := json.Unmarshal(res.Raw, &body); err != nil {
					t.Fatal(err)
				}
				if _, ok := body["data"]; ok {
					t.Errorf("a data entry: nothing ran; body %s", res.Raw)
				}
			})
		}
	}
}

// TestBadRequestBodies: bodies that are not a GraphQL request are refused with 400 and code
// BAD_USER_INPUT, and bodies in another media type with 415.
func TestBadRequestBodies(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	tests := []struct {
		name        string
		contentType string
		body        string
		code        string
	}{
		{"invalid JSON", "application/json", `{"query": "{ me { subject } }"`, "BAD_USER_INPUT"},
		{"empty body", "application/json", ``, "BAD_USER_INPUT"},
		{"JSON with a charset parameter", "application/json; charset=utf-8", `{"query": `, "BAD_USER_INPUT"},
		{"trailing garbage", "application/json", `{"query": "{ me { subject } }"} x`, "BAD_USER_INPUT"},
		{"invalid UTF-8 outside strings", "application/json", "{\"query\": \xff}", "BAD_USER_INPUT"},
		{"JSON nested past the decoder's limit", "application/json", `{"query": "{ me { subject } }", "variables": {"a": ` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}}`, "BAD_USER_INPUT"},
		{"a JSON array (batch)", "application/json", `[{"query": "{ me { subject } }"}]`, "BAD_USER_INPUT"},
		{"a JSON string", "application/json", `"{ me { subject } }"`, "BAD_USER_INPUT"},
		{"query not a string", "application/json", `{"query": 42}`, "BAD_USER_INPUT"},
		{"operationName not a string", "application/json", `{"query": "{ me { subject } }", "operationName": ["a"]}`, "BAD_USER_INPUT"},
		{"variables not an object", "application/json", `{"query": "{ me { subject } }", "variables": [1]}`, "BAD_USER_INPUT"},
		{"extensions not an object", "application/json", `{"query": "{ me { subject } }", "extensions": "x"}`, "BAD_USER_INPUT"},
		{"no query", "application/json", `{"qeury": "{ me { subject } }"}`, "BAD_USER_INPUT"},
		{"an empty object", "application/json", `{}`, "BAD_USER_INPUT"},
		{"a null query", "application/json", `{"query": null, "variables": {}}`, "BAD_USER_INPUT"},
		{"text/plain", "text/plain", `{"query": "{ me { subject } }"}`, "BAD_USER_INPUT"},
		{"application/graphql", "application/graphql", `{ me { subject } }`, "BAD_USER_INPUT"},
		{"form", "application/x-www-form-urlencoded", `query=%7B+me+%7B+subject+%7D+%7D`, "BAD_USER_INPUT"},
		{"no content type", "", `{"query": "{ me { subject } }"}`, "BAD_USER_INPUT"},
	}
	// A body in another media type is 415, with a code saying what to send.
	wantStatus := func(contentType string) int {
		if mt, _, _ := mime.ParseMediaType(contentType); mt != "application/json" {
			return http.StatusUnsupportedMediaType
		}
		return http.StatusBadRequest
	}
	// Each body as a query or mutation (POST) and as a subscription's (SSE): both transports
	// refuse the same bodies alike.
	for _, accept := range []string{"", "text/event-stream"} {
		for _, tt := range tests {
			t.Run(tt.name+" "+accept, func(t *testing.T) {
				req := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(tt.body))
				if tt.contentType != "" {
					req.Header.Set("Content-Type", tt.contentType)
				}
				if accept != "" {
					req.Header.Set("Accept", accept)
				}
				res := a.send(t, tok, req)
				if want := wantStatus(tt.contentType); res.Status != want {
					t.Errorf("status = %d, want %d; body %s", res.Status, want, res.Raw)
				}
				if len(res.Errors) != 1 {
					t.Fatalf("want one error: %s", res.Raw)
				}
				if res.codes()[0] != tt.code {
					t.Errorf("code = %q, want %s", res.codes()[0], tt.code)
				}
				if res.Data != nil {
					t.Errorf("data = %v", res.Data)
				}
			})
		}
	}
}

// TestBodyLimit: a body over MaxBodyBytes is refused with 413 BAD_USER_INPUT, whether its
// length is declared (refused before reading) or not (refused once reading passes the limit);
// a body of exactly the limit is served.
func TestBodyLimit(t *testing.T) {
	const limit = 1 << 20 // the default
	a := newAPI(t)
	tok := a.admin(t)
	// A valid request padded to n bytes with an ignored field.
	body := func(n int) []byte {
		head := `{"query": "{ me { subject } }", "pad": "`
		tail := `"}`
		return []byte(head + strings.Repeat("x", n-len(head)-len(tail)) + tail)
	}

	t.Run("exactly the limit", func(t *testing.T) {
		res := a.do(t, tok, "application/json", body(limit))
		if res.Status != http.StatusOK || len(res.Errors) > 0 || res.Data["me"] == nil {
			t.Errorf("status %d: %.300s", res.Status, res.Raw)
		}
	})
	tests := []struct {
		name    string
		request func() *http.Request
	}{
		{"declared length", func() *http.Request {
			req := httptest.NewRequest(http.MethodPost, "/graphql", bytes.NewReader(body(limit+1)))
			if req.ContentLength != limit+1 {
				t.Fatalf("ContentLength = %d", req.ContentLength)
			}
			return req
		}},
		{"undeclared length", func() *http.Request {
			b := body(limit + 1)
			// MultiReader hides the length from httptest: the server sees a streamed body.
			req := httptest.NewRequest(http.MethodPost, "/graphql", io.MultiReader(bytes.NewReader(b[:10]), bytes.NewReader(b[10:])))
			req.ContentLength = -1
			return req
		}},
		{"declared length lies low", func() *http.Request {
			req := httptest.NewRequest(http.MethodPost, "/graphql", io.MultiReader(bytes.NewReader(body(2*limit))))
			req.ContentLength = 100
			return req
		}},
		{"far over the limit", func() *http.Request {
			req := httptest.NewRequest(http.MethodPost, "/graphql", io.MultiReader(bytes.NewReader(body(8*limit))))
			req.ContentLength = -1
			return req
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.request()
			req.Header.Set("Content-Type", "application/json")
			res := a.send(t, tok, req)
			wantError(t, res, http.StatusRequestEntityTooLarge, "BAD_USER_INPUT")
			if len(res.Raw) > 1000 {
				t.Errorf("the refusal is %d bytes: it must not echo the body", len(res.Raw))
			}
		})
	}

	// A smaller configured limit applies too.
	small := newAPI(t, func(o *Options) { o.MaxBodyBytes = 200 })
	wantError(t, small.do(t, tok, "application/json", body(201)), http.StatusRequestEntityTooLarge, "BAD_USER_INPUT")
	if res := small.do(t, tok, "application/json", body(200)); res.Status != http.StatusOK {
		t.Errorf("a body at a 200-byte limit: status %d", res.Status)
	}
}

// TestParserTokenLimit: a document of more tokens than MaxTokens (default 10,000) is refused
// by the parser with GRAPHQL_PARSE_FAILED; one of exactly 10,000 tokens is served.
func TestParserTokenLimit(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	// 19 tokens of frame + k tags of 8 tokens each ({ name : "a" value : "b" }) + m bare
	// fields. The tokens sit in an argument so that no selection set is wide.
	doc := func(k, m int) string {
		return `{ instances(organizationId: "acme", filter: {tags: [` +
			strings.Repeat(`{name: "a", value: "b"} `, k) + `]}) { totalCount ` +
			strings.Repeat("__typename ", m) + `} }`
	}
	if res := a.post(t, tok, doc(1247, 5), nil); res.Status != http.StatusOK || len(res.Errors) > 0 {
		t.Errorf("10,000 tokens: status %d, codes %v %.300s", res.Status, res.codes(), res.Raw)
	}
	wantError(t, a.post(t, tok, doc(1247, 6), nil), http.StatusOK, "GRAPHQL_PARSE_FAILED")
	// Far over the limit but far under the body limit: the parser stops early.
	wantError(t, a.post(t, tok, "{"+strings.Repeat(" a: __typename", 50_000)+" }", nil), http.StatusOK, "GRAPHQL_PARSE_FAILED")

	small := newAPI(t, func(o *Options) { o.MaxTokens = 10 })
	if res := small.post(t, tok, `{ me { subject } }`, nil); res.Status != http.StatusOK {
		t.Errorf("6 tokens at a limit of 10: status %d", res.Status)
	}
	wantError(t, small.post(t, tok, `{ me { subject grants { role organizationId } } }`, nil), http.StatusOK, "GRAPHQL_PARSE_FAILED")
}

// TestOversizedFieldsInValidJSONAreUserErrors: huge values inside a well-formed request under
// the body limit reach validation and come back as BAD_USER_INPUT user errors on their field,
// without echoing the value and without writing anything.
func TestOversizedFieldsInValidJSONAreUserErrors(t *testing.T) {
	a := newAPI(t)
	tok := a.member(t)
	many := func(n int, f func(i int) any) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = f(i)
		}
		return out
	}
	tests := []struct {
		name   string
		fields map[string]any
		want   fieldCode
	}{
		{"name of 100 KB", map[string]any{"name": strings.Repeat("n", 100<<10)}, fc("BAD_USER_INPUT", "input", "name")},
		{"user data of 700 KB", map[string]any{"userData": b64("#cloud-config\n" + strings.Repeat("#", 500<<10))}, fc("BAD_USER_INPUT", "input", "userData")},
		{"user data just over 32 KiB decoded", map[string]any{"userData": b64("#!/bin/sh\n" + strings.Repeat("#", 32<<10-9))}, fc("BAD_USER_INPUT", "input", "userData")},
		{"description of 500 KB", map[string]any{"description": strings.Repeat("d", 500<<10)}, fc("BAD_USER_INPUT", "input", "description")},
		{"tag value of 100 KB", map[string]any{"tags": []any{map[string]any{"name": "k", "value": strings.Repeat("v", 100<<10)}}}, fc("BAD_USER_INPUT", "input", "tags", "0", "value")},
		{"10,000 tags", map[string]any{"tags": many(10_000, func(i int) any { return map[string]any{"name": fmt.Sprint("t", i), "value": ""} })}, fc("BAD_USER_INPUT", "input", "tags")},
		{"1,000 security groups", map[string]any{"networking": map[string]any{"securityGroupIds": many(1000, func(i int) any { return fmt.Sprint("sg-", i) })}},
			fc("BAD_USER_INPUT", "input", "networking", "securityGroupIds")},
		{"10,000 source addresses", map[string]any{"networking": map[string]any{"allowedSourceAddresses": many(10_000, func(int) any { return "10.0.0.0/8" })}},
			fc("BAD_USER_INPUT", "input", "networking", "allowedSourceAddresses")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := a.storeState(t)
			res, p := a.create(t, tok, with("big", tt.fields))
			wantUserErrors(t, res, p, tt.want)
			if len(res.Raw) > 2000 {
				t.Errorf("the refusal is %d bytes: it echoes the input", len(res.Raw))
			}
			if !reflect.DeepEqual(before, a.storeState(t)) {
				t.Error("a refused create changed Redis")
			}
		})
	}
	// The same limits hold on update.
	inst := a.mustCreate(t, tok, createInput("small"))
	res, p := a.update(t, tok, map[string]any{"id": inst.ID, "description": strings.Repeat("d", 500<<10), "userData": b64("#!/bin/sh\n" + strings.Repeat("#", 100<<10)), "allowRebuild": true})
	wantUserErrors(t, res, p, fc("BAD_USER_INPUT", "input", "description"), fc("BAD_USER_INPUT", "input", "userData"))
}

// TestHostileRequestsNeverCauseA500: a battery of malformed, oversized and odd requests; each
// gets a JSON answer with a 2xx or 4xx status, never a 5xx, a panic or a non-JSON body.
func TestHostileRequestsNeverCauseA500(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	inst := a.mustCreate(t, tok, createInput("victim"))
	js := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	op := func(query string, vars any) string { return js(map[string]any{"query": query, "variables": vars}) }
	type hostile struct {
		name, method, contentType, body string
	}
	post := func(name, body string) hostile { return hostile{name, http.MethodPost, "application/json", body} }
	tests := []hostile{
		post("empty", ``),
		post("whitespace", "  \n\t "),
		post("null", `null`),
		post("true", `true`),
		post("number", `12345678901234567890`),
		post("empty object", `{}`),
		post("empty batch", `[]`),
		post("batch", `[{"query":"{ me { subject } }"},{"query":"{ me { subject } }"}]`),
		post("query null", `{"query": null}`),
		post("operationName not a string", `{"query": "{ me { subject } }", "operationName": 7}`),
		post("unknown operationName", `{"query": "query A { me { subject } }", "operationName": "B"}`),
		post("two operations without a name", `{"query": "query A { me { subject } } query B { me { subject } }"}`),
		post("extensions not an object", `{"query": "{ me { subject } }", "extensions": "x"}`),
		post("persisted query hash only", `{"extensions": {"persistedQuery": {"version": 1, "sha256Hash": "00"}}}`),
		post("persisted query hash mismatch", `{"query": "{ me { subject } }", "extensions": {"persistedQuery": {"version": 1, "sha256Hash": "00"}}}`),
		post("persisted query version 2", `{"query": "{ me { subject } }", "extensions": {"persistedQuery": {"version": 2, "sha256Hash": "00"}}}`),
		post("NUL in the query", `{"query": "{ me \u0000 { subject } }"}`),
		post("invalid UTF-8 in a string", "{\"query\": \"{ me { subject } }\xff\xfe\"}"),
		post("lone surrogate in a name", strings.Replace(op(createMutation, map[string]any{"input": with("SURROGATE", nil)}), "SURROGATE", `\ud800`, 1)),
		post("byte order mark", "\ufeff"+op(`{ me { subject } }`, nil)),
		post("duplicate JSON keys", `{"query": "{ me { subject } }", "query": "{ regions { id } }", "variables": {}, "variables": null}`),
		post("huge Int variable", op(`query($n: Int) { instances(organizationId: "acme", first: $n) { totalCount } }`, map[string]any{"n": json.Number("1e400")})),
		post("Int variable past int64", op(`query($n: Int) { instances(organizationId: "acme", first: $n) { totalCount } }`, map[string]any{"n": json.Number("9223372036854775808")})),
		post("Int variable at int64 max", op(`query($n: Int) { instances(organizationId: "acme", first: $n) { edges { node { id } } } }`, map[string]any{"n": json.Number("9223372036854775807")})),
		post("negative Int variable", op(`query($n: Int) { instances(organizationId: "acme", first: $n) { totalCount } }`, map[string]any{"n": -9223372036854775807})),
		post("expectedGeneration at int64 max", op(updateFull, map[string]any{"input": map[string]any{"id": inst.ID, "expectedGeneration": json.Number("9223372036854775807")}})),
		post("setQuota at int64 max", op(`mutation { setQuota(input: {organizationId: "acme", limits: [{kind: "servers", limit: 2147483647}]}) { userErrors { code } } }`, nil)),
		post("deep list variable", op(`query($f: InstanceFilter) { instances(organizationId: "acme", filter: $f) { totalCount } }`, map[string]any{"f": map[string]any{"tags": [][][][]any{{{{"x"}}}}}})),
		post("nested selection 1,000 deep", js(map[string]any{"query": strings.Repeat("{ me ", 1000) + strings.Repeat("}", 1000)})),
		post("1,000 directives", js(map[string]any{"query": "{ me " + strings.Repeat("@include(if: true) ", 1000) + "{ subject } }"})),
		post("1,000 aliases of a list", js(map[string]any{"query": "{ " + func() string {
			var b strings.Builder
			for i := range 1000 {
				fmt.Fprintf(&b, "r%d: regions { id } ", i)
			}
			return b.String()
		}() + "}"})),
		post("100 KB nameContains", op(`query($s: String) { instances(organizationId: "acme", filter: {nameContains: $s}) { totalCount } }`, map[string]any{"s": strings.Repeat("%", 100<<10)})),
		post("Redis pattern characters in an id", op(`query($id: ID!) { instance(id: $id) { id } }`, map[string]any{"id": "*"})),
		post("Lua-looking organization", op(`{ instances(organizationId: "acme\"); redis.call('FLUSHALL') --") { totalCount } }`, nil)),
		post("hash-tag braces in an organization", op(`query($o: ID!) { quota(organizationId: $o) { organizationId } }`, map[string]any{"o": "}{o:acme"})),
		post("mutation with variables for another operation", op(createMutation, map[string]any{"nope": 1})),
		post("__typename on a mutation", op(`mutation { __typename }`, nil)),
		{"PUT", http.MethodPut, "application/json", op(`{ me { subject } }`, nil)},
		{"DELETE", http.MethodDelete, "", ``},
		{"PATCH", http.MethodPatch, "application/json", op(`{ me { subject } }`, nil)},
		{"multipart", http.MethodPost, "multipart/form-data; boundary=x", "--x\r\nContent-Disposition: form-data; name=\"operations\"\r\n\r\n{}\r\n--x--\r\n"},
		{"malformed content type", http.MethodPost, "application/json; charset", op(`{ me { subject } }`, nil)},
		{"GET with a body", http.MethodGet, "application/json", op(`{ me { subject } }`, nil)},
	}
	if len(tests) < 30 {
		t.Fatalf("only %d hostile requests", len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(tt.method, "/graphql", strings.NewReader(tt.body))
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			req.Header.Set("Authorization", "Bearer "+tok)
			rec := within(t, 10*time.Second, func() *httptest.ResponseRecorder { return a.serve(req) })
			t.Logf("status %d: %.200s", rec.Code, rec.Body.String())
			if rec.Code >= 500 || rec.Code < 200 {
				t.Errorf("status %d: %.500s", rec.Code, rec.Body.String())
			}
			if !json.Valid(rec.Body.Bytes()) {
				t.Errorf("status %d, body is not JSON: %.500s", rec.Code, rec.Body.String())
			}
			var out struct {
				Errors []struct {
					Extensions map[string]any `json:"extensions"`
				} `json:"errors"`
			}
			_ = json.Unmarshal(rec.Body.Bytes(), &out)
			for _, e := range out.Errors {
				if e.Extensions["code"] == "INTERNAL" {
					t.Errorf("internal error: %.500s", rec.Body.String())
				}
			}
		})
	}
	// None of that touched the instance.
	got := a.mustPost(t, tok, `query($id: ID!) { instance(id: $id) { generation deletedAt } }`, map[string]any{"id": inst.ID})
	if d := got.Data["instance"].(map[string]any); d["generation"] != float64(1) || d["deletedAt"] != nil {
		t.Errorf("the instance changed: %s", got.Raw)
	}
}

// TestPersistedQueryRefusalsHaveCodes: every refusal of gqlgen's persisted-query extension
// carries a code, as every top-level error does: a hash it does not know, and extension data
// it cannot use.
func TestPersistedQueryRefusalsHaveCodes(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	for body, code := range map[string]string{
		`{"extensions": {"persistedQuery": {"version": 1, "sha256Hash": "00"}}}`:                                "PERSISTED_QUERY_NOT_FOUND",
		`{"query": "{ me { subject } }", "extensions": {"persistedQuery": {"version": 1, "sha256Hash": "00"}}}`: "BAD_USER_INPUT",
		`{"query": "{ me { subject } }", "extensions": {"persistedQuery": {"version": 2, "sha256Hash": "00"}}}`: "BAD_USER_INPUT",
		`{"query": "{ me { subject } }", "extensions": {"persistedQuery": "yes"}}`:                              "BAD_USER_INPUT",
	} {
		wantError(t, a.do(t, tok, "application/json", []byte(body)), http.StatusOK, code)
	}
}

// TestPersistedQueryCacheHoldsNoHeavyEntry: the persisted queries are held in a cache bounded by
// bytes, which keeps no entry over a sixteenth of its 16 MiB: a query of over 1 MiB runs when
// sent whole, and is not found by its hash alone afterwards, where a small one is.
func TestPersistedQueryCacheHoldsNoHeavyEntry(t *testing.T) {
	a := newAPI(t, func(o *Options) { o.MaxBodyBytes = 4 << 20 })
	tok := a.admin(t)
	persisted := func(query string, whole bool) []byte {
		sum := sha256.Sum256([]byte(query))
		req := map[string]any{"extensions": map[string]any{"persistedQuery": map[string]any{"version": 1, "sha256Hash": hex.EncodeToString(sum[:])}}}
		if whole {
			req["query"] = query
		}
		body, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		return body
	}
	small := "{ me { subject } }"
	heavy := small + "\n#" + strings.Repeat("x", 1<<20)
	for _, q := range []string{small, heavy} {
		if got := a.do(t, tok, "application/json", persisted(q, true)); len(got.Errors) > 0 || got.Data["me"] == nil {
			t.Fatalf("a persisted query of %d bytes sent whole: %s", len(q), got.Raw)
		}
	}
	if got := a.do(t, tok, "application/json", persisted(small, false)); len(got.Errors) > 0 || got.Data["me"] == nil {
		t.Errorf("the small query by its hash: %s", got.Raw)
	}
	wantError(t, a.do(t, tok, "application/json", persisted(heavy, false)), http.StatusOK, "PERSISTED_QUERY_NOT_FOUND")
}
