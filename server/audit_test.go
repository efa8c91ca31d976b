package server

import (
	"strings"
	"testing"

	"github.com/computeql/computeql/logtest"
)

// checkAudit checks what one mutation call of the authorization matrix logged: nothing when
// authentication refused it (it never ran), else exactly one audit record naming the
// mutation, the caller's subject, the id or organization it named, and the outcome the
// caller got: "ok", the top-level error's code, or the first userError's code.
func checkAudit(tb testing.TB, records []logtest.Record, field, subject, outcome string, vars map[string]any) {
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
	got := records[0].Attrs
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
