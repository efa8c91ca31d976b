package server

import (
	"encoding/json"
	"testing"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// TestAppendResponseIsEncodingJSONs: the POST transport's answers are byte for byte what
// encoding/json makes of them, less the data entry of an operation refused before it ran.
func TestAppendResponseIsEncodingJSONs(t *testing.T) {
	hasNext := true
	coded := &gqlerror.Error{Message: "no <such> \"thing\"", Path: ast.Path{ast.PathName("instance")}, Extensions: map[string]any{"code": "NOT_FOUND"}}
	tests := []struct {
		name string
		resp graphql.Response
	}{
		{"data", graphql.Response{Data: json.RawMessage(`{"createInstance":{"instance":{"id":"a"},"userErrors":[]}}`)}},
		{"data to escape for HTML", graphql.Response{Data: json.RawMessage("{\"description\":\"<b>&amp;\u2028\u2029 é\"}")}},
		{"no data", graphql.Response{}},
		{"data and errors", graphql.Response{Data: json.RawMessage(`{"instance":null}`), Errors: gqlerror.List{coded}}},
		{"errors alone", graphql.Response{Errors: gqlerror.List{coded, {Message: "second"}}}},
		{"extensions", graphql.Response{Data: json.RawMessage(`{"ping":"pong"}`), Extensions: map[string]any{"cost": &costExtension{Maximum: 1000, Requested: 3, Throttle: &throttleStatus{Available: 9, Maximum: 10, Restore: 0.5}}}}},
		{"incremental", graphql.Response{Data: json.RawMessage(`{"a":1}`), Label: "l", Path: ast.Path{ast.PathName("a")}, HasNext: &hasNext}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := json.Marshal(&tt.resp)
			if err != nil {
				t.Fatal(err)
			}
			got, err := appendResponse(nil, &tt.resp, true)
			if err != nil || string(got) != string(want) {
				t.Errorf("appendResponse = %s, %v\nwant %s", got, err, want)
			}

			refused, err := appendResponse(nil, &tt.resp, false)
			if err != nil {
				t.Fatal(err)
			}
			var gotMap, wantMap map[string]any
			if err := json.Unmarshal(refused, &gotMap); err != nil {
				t.Fatalf("refused answer %s: %v", refused, err)
			}
			_ = json.Unmarshal(want, &wantMap)
			delete(wantMap, "data")
			for _, k := range []string{"errors", "extensions"} {
				if string(mustJSON(t, gotMap[k])) != string(mustJSON(t, wantMap[k])) {
					t.Errorf("refused answer's %s = %s, want %s", k, mustJSON(t, gotMap[k]), mustJSON(t, wantMap[k]))
				}
			}
			if _, ok := gotMap["data"]; ok {
				t.Errorf("refused answer %s has a data entry", refused)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
