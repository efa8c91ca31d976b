package server

import (
	"maps"
	"reflect"
	"testing"

	"github.com/computeql/computeql/redistest"
)

const createDryRun = `mutation($input: CreateInstanceInput!) {
  createInstance(input: $input) { instance { id } userErrors { field code message }
    plan { rebuild restart changedFields quotaChanges { kind delta } } } }`

const updateDryRun = `mutation($input: UpdateInstanceInput!) {
  updateInstance(input: $input) { instance { id } userErrors { field code message }
    plan { rebuild restart changedFields quotaChanges { kind delta } } } }`

// gqlPlan is a ChangePlan as the documents above select it.
type gqlPlan struct {
	Rebuild       bool     `json:"rebuild"`
	Restart       bool     `json:"restart"`
	ChangedFields []string `json:"changedFields"`
	QuotaChanges  []struct {
		Kind  string `json:"kind"`
		Delta int    `json:"delta"`
	} `json:"quotaChanges"`
}

// dryRun sends a dry run and returns its plan (nil when there is none) and user errors; it
// checks that nothing was returned as made and that Redis is unchanged.
func (a *api) dryRun(t *testing.T, token, doc, field string, input map[string]any) (*gqlPlan, []userError) {
	t.Helper()
	input["dryRun"] = true
	before := redistest.State(t, a.rdb)
	res := a.post(t, token, doc, map[string]any{"input": input})
	if res.Status != 200 || len(res.Errors) > 0 {
		t.Fatalf("dry run: %s", res.Raw)
	}
	var p struct {
		Instance   any         `json:"instance"`
		UserErrors []userError `json:"userErrors"`
		Plan       *gqlPlan    `json:"plan"`
	}
	decode(t, res.Data[field], &p)
	if p.Instance != nil {
		t.Errorf("a dry run returned an instance: %s", res.Raw)
	}
	if (p.Plan == nil) == (len(p.UserErrors) == 0) {
		t.Errorf("a dry run answers a plan or user errors, one of them: %s", res.Raw)
	}
	if after := redistest.State(t, a.rdb); !maps.Equal(before, after) {
		t.Errorf("a dry run changed Redis: %s", res.Raw)
	}
	return p.Plan, p.UserErrors
}

func (p *gqlPlan) quota() map[string]int {
	out := map[string]int{}
	for _, q := range p.QuotaChanges {
		out[q.Kind] = q.Delta
	}
	return out
}

// TestDryRuns: createInstance and updateInstance with dryRun check everything a real one
// does (the taken name and the quota included) and answer the plan — rebuild, fields that
// would change, quota per kind — or the same user errors, writing nothing either way.
func TestDryRuns(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	inst := a.mustCreate(t, tok, createInput("web-1"))

	t.Run("create", func(t *testing.T) {
		plan, errs := a.dryRun(t, tok, createDryRun, "createInstance", createInput("web-2"))
		if len(errs) > 0 || plan == nil {
			t.Fatalf("user errors %+v", errs)
		}
		// g1.small: 2 vCPUs, 4 GiB.
		if want := map[string]int{"servers": 1, "cpus": 2, "memoryGiB": 4}; !reflect.DeepEqual(plan.quota(), want) || plan.Rebuild || plan.Restart || len(plan.ChangedFields) != 0 {
			t.Errorf("plan %+v, want quota %v and nothing else", plan, want)
		}
		_, errs = a.dryRun(t, tok, createDryRun, "createInstance", with("WEB-1", map[string]any{"flavorId": "nope"}))
		if got := fieldCodes(errs); !reflect.DeepEqual(got, []fieldCode{fc("NOT_FOUND", "input", "flavorId"), fc("CONFLICT", "input", "name")}) {
			t.Errorf("a bad flavor and a taken name: %+v", got)
		}
		a.mustPost(t, tok, `mutation { setQuota(input: {organizationId: "acme", limits: [{kind: "servers", limit: 1}]}) { userErrors { code } } }`, nil)
		_, errs = a.dryRun(t, tok, createDryRun, "createInstance", createInput("web-3"))
		if len(errs) != 1 || errs[0].Code != "QUOTA_EXCEEDED" {
			t.Errorf("over quota: %+v, want QUOTA_EXCEEDED", errs)
		}
		a.mustPost(t, tok, `mutation { setQuota(input: {organizationId: "acme", limits: [{kind: "servers", limit: 100}]}) { userErrors { code } } }`, nil)
	})

	t.Run("update", func(t *testing.T) {
		plan, errs := a.dryRun(t, tok, updateDryRun, "updateInstance", map[string]any{"id": inst.ID, "description": "new"})
		if len(errs) > 0 || plan.Rebuild || !reflect.DeepEqual(plan.ChangedFields, []string{"description"}) || len(plan.QuotaChanges) != 0 {
			t.Errorf("description: plan %+v errors %+v, want description changed, no rebuild, no quota", plan, errs)
		}
		_, errs = a.dryRun(t, tok, updateDryRun, "updateInstance", map[string]any{"id": inst.ID, "flavorId": "g1.medium"})
		if got := fieldCodes(errs); !reflect.DeepEqual(got, []fieldCode{fc("UNPROCESSABLE", "input", "flavorId")}) {
			t.Errorf("a flavor change without allowRebuild: %+v", got)
		}
		plan, errs = a.dryRun(t, tok, updateDryRun, "updateInstance", map[string]any{"id": inst.ID, "flavorId": "g1.medium", "allowRebuild": true})
		// g1.medium: 4 vCPUs, 16 GiB, against g1.small's 2 and 4.
		if len(errs) > 0 || !plan.Rebuild || !reflect.DeepEqual(plan.ChangedFields, []string{"flavorId"}) ||
			!reflect.DeepEqual(plan.quota(), map[string]int{"cpus": 2, "memoryGiB": 12}) {
			t.Errorf("a flavor change with allowRebuild: plan %+v errors %+v, want a rebuild of flavorId taking 2 cpus and 12 GiB", plan, errs)
		}
		_, errs = a.dryRun(t, tok, updateDryRun, "updateInstance", map[string]any{"id": inst.ID, "description": "x", "expectedGeneration": 7})
		if got := fieldCodes(errs); !reflect.DeepEqual(got, []fieldCode{fc("CONFLICT", "input", "expectedGeneration")}) {
			t.Errorf("a stale expectedGeneration: %+v", got)
		}
	})
}
