package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/instance"
)

// v1Record is an instance record as releases before schema versions wrote it.
type v1Record struct {
	Org    string            `json:"org"`
	ID     string            `json:"id"`
	Fields map[string]string `json:"fields"`
}

// loadV1Fixture writes testdata/schema-v1.json's records into Redis as those releases did:
// the instance hash, without v, and the organization and project indexes.
func loadV1Fixture(t *testing.T, rdb *redis.Client) []v1Record {
	t.Helper()
	raw, err := os.ReadFile("testdata/schema-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	var recs []v1Record
	if err := json.Unmarshal(raw, &recs); err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := rdb.HSet(ctx, instanceKey(r.Org, r.ID), r.Fields).Err(); err != nil {
			t.Fatal(err)
		}
		rdb.ZAdd(ctx, orgIndexKey(r.Org), redis.Z{Member: r.ID})
		rdb.ZAdd(ctx, projectIndexKey(r.Org, r.Fields["proj"]), redis.Z{Member: r.ID})
	}
	return recs
}

// TestUpgradeMigratesOldRecordsOnce: records without a version (the fixture of an older
// release) are readable as they are; four processes upgrading at once migrate each exactly
// once to the current version, keeping what every record means and its generations, with
// spec and status in the current JSON shape; the organizations are then marked, and an
// upgrade again does nothing. Records the new code creates carry the version from the start.
func TestUpgradeMigratesOldRecordsOnce(t *testing.T) {
	rdb := redisServer.Client(t)
	st := New(rdb)
	recs := loadV1Fixture(t, rdb)
	orgs := []string{"acme", "globex"}

	before := map[string]*instance.Instance{}
	for _, r := range recs {
		inst, err := st.Get(ctx, []string{r.Org}, r.ID)
		if err != nil {
			t.Fatalf("a version-1 record does not read: %v", err)
		}
		before[r.ID] = inst
	}

	var wg sync.WaitGroup
	results := make([]Upgraded, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Go(func() { results[i], errs[i] = st.Upgrade(ctx, orgs) })
	}
	wg.Wait()
	migrated := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("upgrade %d: %v", i, err)
		}
		migrated += results[i].Records
	}
	if migrated != len(recs) {
		t.Errorf("%d records rewritten by four upgrades, want each of the %d once", migrated, len(recs))
	}

	for _, r := range recs {
		f := hgetall(t, rdb, instanceKey(r.Org, r.ID))
		if f["v"] != strconv.Itoa(SchemaVersion) || f["gen"] != r.Fields["gen"] || f["sv"] != r.Fields["sv"] || f["proj"] != r.Fields["proj"] {
			t.Errorf("%s after upgrade: v %s gen %s sv %s proj %s", r.ID, f["v"], f["gen"], f["sv"], f["proj"])
		}
		after, err := st.Get(ctx, []string{r.Org}, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(after, before[r.ID]) {
			t.Errorf("%s changed meaning:\nbefore %+v\nafter  %+v", r.ID, before[r.ID], after)
		}
		spec, large, _ := encodeSpec(&after.Spec)
		status, _ := json.Marshal(&after.Status)
		stored := [3]any{f["description"], []byte(f["tags"]), []byte(f["userData"])}
		if f["spec"] != string(spec) || fmt.Sprint(stored) != fmt.Sprint(large) || f["status"] != string(status) {
			t.Errorf("%s is not in the current shape:\nspec %s\nwant %s\nlarge fields %q\nwant %q\nstatus %s\nwant %s", r.ID, f["spec"], spec, stored, large, f["status"], status)
		}
	}
	for _, org := range orgs {
		if v, _ := rdb.Get(ctx, schemaKey(org)).Result(); v != strconv.Itoa(SchemaVersion) {
			t.Errorf("%s marked %q, want %d", org, v, SchemaVersion)
		}
	}
	if again, err := st.Upgrade(ctx, orgs); err != nil || again != (Upgraded{}) {
		t.Errorf("a second upgrade did %+v (%v), want nothing", again, err)
	}

	inst := newInstance("acme", "web", "new-1")
	if _, err := st.Create(ctx, inst, "net-1/new-1", roomy, instance.Idempotency{}); err != nil {
		t.Fatal(err)
	}
	if v := hgetall(t, rdb, instanceKey("acme", inst.ID))["v"]; v != strconv.Itoa(SchemaVersion) {
		t.Errorf("a new record has version %q, want %d", v, SchemaVersion)
	}
}

// TestUpgradeRereadsARecordThatChanged: a record written between the upgrade's read and its
// write (its status version moved) is not overwritten with the stale copy.
func TestUpgradeRereadsARecordThatChanged(t *testing.T) {
	rdb := redisServer.Client(t)
	st := New(rdb)
	r := loadV1Fixture(t, rdb)[0]
	key := instanceKey(r.Org, r.ID)
	stale := map[string]string{}
	for k, v := range r.Fields {
		stale[k] = v
	}
	for v := 1; v < SchemaVersion; v++ {
		if err := migrations[v](stale); err != nil {
			t.Fatal(err)
		}
	}
	// A worker writes a new status (sv 4 → 5) after the upgrade read version 4.
	rdb.HSet(ctx, key, "sv", "5", "status", `{"provisioningStatus":"PROVISIONED","healthStatus":"DEGRADED","powerState":"RUNNING","observedGeneration":1}`)
	ok, err := upgradeScript.Run(ctx, rdb, []string{key}, "", r.Fields["gen"], r.Fields["sv"], SchemaVersion, stale["spec"], stale["status"], stale["large"]).Bool()
	if err != nil || ok {
		t.Fatalf("the stale write was applied (%v, %v)", ok, err)
	}
	if _, err := st.Upgrade(ctx, []string{r.Org}); err != nil {
		t.Fatal(err)
	}
	inst, err := st.Get(ctx, []string{r.Org}, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Status.HealthStatus != instance.HealthDegraded || hgetall(t, rdb, key)["v"] != strconv.Itoa(SchemaVersion) {
		t.Errorf("after the re-read: health %s, v %s; want the worker's DEGRADED, upgraded", inst.Status.HealthStatus, hgetall(t, rdb, key)["v"])
	}
}

// TestNewerSchemaIsRefused: a record or an organization marked by a newer computeql is
// neither read nor upgraded, rather than misread or rewritten with fields lost.
func TestNewerSchemaIsRefused(t *testing.T) {
	rdb := redisServer.Client(t)
	st := New(rdb)
	r := loadV1Fixture(t, rdb)[0]
	rdb.HSet(ctx, instanceKey(r.Org, r.ID), "v", SchemaVersion+1)
	if _, err := st.Get(ctx, []string{r.Org}, r.ID); !errors.Is(err, ErrNewerSchema) {
		t.Errorf("get of a newer record: %v, want ErrNewerSchema", err)
	}
	if _, err := st.Upgrade(ctx, []string{r.Org}); !errors.Is(err, ErrNewerSchema) {
		t.Errorf("upgrade over a newer record: %v, want ErrNewerSchema", err)
	}
	rdb.Set(ctx, schemaKey("globex"), SchemaVersion+1, 0)
	if _, err := st.Upgrade(ctx, []string{"globex"}); !errors.Is(err, ErrNewerSchema) {
		t.Errorf("upgrade of an organization marked newer: %v, want ErrNewerSchema", err)
	}
}
