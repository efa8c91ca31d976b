package app

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzParseFaults: --region-faults is accepted only as one JSON document (or empty), every
// refusal names the flag, and accepted faults written back in the flag's format read back
// the same.
func FuzzParseFaults(f *testing.F) {
	for _, s := range []string{
		"", `{}`, `null`, `{"errorRate": 0.3, "slowCalls": "200ms", "failBuildPrefix": "fail-", "duplicateCreates": true}`,
		`{"slowCalls": "1h2m3.5s"}`, `{"slowCalls": "-1s"}`, `{"slowCalls": "soon"}`, `{"errorRat": 1}`, `{"errorRate": 1e400}`,
		`{} {}`, `{}x`, `{"errorRate": 0.1}]`, ` {} `, `not json`, `[]`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		faults, err := parseFaults(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--region-faults: ") {
				t.Fatalf("refusal of %q does not name the flag: %v", s, err)
			}
			return
		}
		if s != "" && !json.Valid([]byte(s)) {
			t.Fatalf("%q accepted as %+v but is not one JSON document", s, faults)
		}
		written, err := json.Marshal(map[string]any{
			"errorRate": faults.ErrorRate, "slowCalls": faults.SlowCalls.String(),
			"failBuildPrefix": faults.FailBuildPrefix, "duplicateCreates": faults.DuplicateCreates,
		})
		if err != nil {
			t.Fatal(err)
		}
		if back, err := parseFaults(string(written)); err != nil || back != faults {
			t.Fatalf("%q read as %+v, written as %s, reads back as %+v, %v", s, faults, written, back, err)
		}
	})
}
