package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/instance"
)

// SchemaVersion is the version of the instance records this code writes, in each instance
// hash's field v. Version 1 is every record written before records carried a version (no v
// field); readers still accept it, since the step to 2 changes no meaning.
const SchemaVersion = 3

// largeSplitVersion is the first schema version whose records keep their large fields in
// hash fields of their own (description, tags, userData), apart from spec, so that events
// (which copy spec) do not carry them. A record of an earlier version has them in spec.
const largeSplitVersion = 3

// ErrNewerSchema is a record, or an organization's records, written by a newer version of
// computeql than this one: reading or rewriting them could lose what this code does not know.
var ErrNewerSchema = errors.New("written by a newer computeql: upgrade this process")

// migrations[v] turns the fields of an instance record of version v into version v+1, in
// place. A migration must be deterministic: several processes may run it on one record, and
// only the first one's write lands.
var migrations = map[int]func(fields map[string]string) error{
	// 1 → 2: spec and status are decoded and encoded again with the current types, so that
	// every record has the current JSON shape, and the record is stamped with its version.
	1: func(f map[string]string) error {
		var spec instance.Spec
		var status instance.Status
		if err := errors.Join(json.Unmarshal([]byte(f["spec"]), &spec), json.Unmarshal([]byte(f["status"]), &status)); err != nil {
			return err
		}
		specJSON, err1 := spec.AppendJSON(nil)
		statusJSON, err2 := status.AppendJSON(nil)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		f["spec"], f["status"] = string(specJSON), string(statusJSON)
		return nil
	},
	// 2 → 3: the large fields move out of spec into fields of their own (see
	// largeSplitVersion).
	2: func(f map[string]string) error {
		var spec instance.Spec
		if err := json.Unmarshal([]byte(f["spec"]), &spec); err != nil {
			return err
		}
		specJSON, large, err := encodeSpec(&spec)
		if err != nil {
			return err
		}
		f["spec"] = string(specJSON)
		f["description"], f["tags"], f["userData"] = large[0].(string), string(large[1].([]byte)), string(large[2].([]byte))
		return nil
	},
}

// recordVersion is the schema version of a record's v field ("" before versions existed).
func recordVersion(v string) (int, error) {
	if v == "" {
		return 1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("schema version %q is not a version", v)
	}
	if n > SchemaVersion {
		return 0, fmt.Errorf("schema version %d: %w", n, ErrNewerSchema)
	}
	return n, nil
}

// Upgraded is what an Upgrade did.
type Upgraded struct {
	// Organizations is how many organizations' records were looked at (not yet marked current).
	Organizations int
	// Records is how many records this call rewrote.
	Records int
}

// upgradeBatch is how many records are read in one round trip.
const upgradeBatch = 500

// Upgrade migrates the instance records of the organizations to SchemaVersion, once: an
// organization whose records are all current is marked so, and later calls skip it with one
// GET. It is safe for several processes to run at once: each record is rewritten with a
// check-and-set on its version and its generations, so a record is migrated once, and a
// record that changed meanwhile is read again. Records that processes of an older version
// write during a rolling upgrade stay readable, and are upgraded at the next start.
func (s *Store) Upgrade(ctx context.Context, orgs []string) (Upgraded, error) {
	var done Upgraded
	for _, org := range orgs {
		marked, err := s.rdb.Get(ctx, schemaKey(org)).Int()
		switch {
		case err != nil && !errors.Is(err, redis.Nil):
			return done, fmt.Errorf("upgrade %s: %w", org, err)
		case marked > SchemaVersion:
			return done, fmt.Errorf("upgrade %s: schema version %d: %w", org, marked, ErrNewerSchema)
		case marked == SchemaVersion:
			continue
		}
		done.Organizations++
		n, err := s.upgradeOrg(ctx, org)
		done.Records += n
		if err != nil {
			return done, fmt.Errorf("upgrade %s: %w", org, err)
		}
		if err := s.rdb.Set(ctx, schemaKey(org), SchemaVersion, 0).Err(); err != nil {
			return done, fmt.Errorf("upgrade %s: mark: %w", org, err)
		}
	}
	return done, nil
}

// upgradeOrg migrates the records of one organization, in index order, a batch at a time.
func (s *Store) upgradeOrg(ctx context.Context, org string) (int, error) {
	migrated, start := 0, "-"
	for {
		ids, err := s.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{
			Key: orgIndexKey(org), Start: start, Stop: "+", ByLex: true, Count: upgradeBatch,
		}).Result()
		if err != nil || len(ids) == 0 {
			return migrated, err
		}
		for _, id := range ids {
			ok, err := s.upgradeRecord(ctx, org, id)
			if err != nil {
				return migrated, fmt.Errorf("instance %s: %w", id, err)
			}
			if ok {
				migrated++
			}
		}
		start = "(" + ids[len(ids)-1]
	}
}

// upgradeRecord migrates one record; it reports whether this call rewrote it.
func (s *Store) upgradeRecord(ctx context.Context, org, id string) (bool, error) {
	key := instanceKey(org, id)
	for {
		f, err := s.rdb.HGetAll(ctx, key).Result()
		if err != nil {
			return false, err
		}
		if len(f) == 0 {
			return false, nil // forgotten meanwhile
		}
		from, err := recordVersion(f["v"])
		if err != nil || from == SchemaVersion {
			return false, err
		}
		gen, sv := f["gen"], f["sv"]
		for v := from; v < SchemaVersion; v++ {
			if err := migrations[v](f); err != nil {
				return false, fmt.Errorf("migrate from schema version %d: %w", v, err)
			}
		}
		ok, err := upgradeScript.Run(ctx, s.rdb, []string{key}, f["v"], gen, sv, SchemaVersion, f["spec"], f["status"], f["description"], f["tags"], f["userData"]).Bool()
		if err != nil || ok {
			return ok, err
		}
	}
}
