package instance

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"

	"github.com/computeql/computeql/auth"
)

// An idempotency key makes a retried mutation safe: the same caller sending the same key
// again within a day gets the answer of the first call (the instance it made or changed, as it
// is now) with no second effect, and the same key with a different request is refused with
// CONFLICT. The key is recorded by the script that makes the change (Store.Create,
// Store.UpdateSpec), so there is never a key without its change nor a change without its key.

// maxIdempotencyKey bounds a key, which callers choose: 1 to 64 printable ASCII characters.
const maxIdempotencyKey = 64

// idempotency is a mutation's key, checked: the key hashed with the caller's subject (so that
// callers never share keys, and the stored name reveals neither) and the fingerprint of the
// request, which a retry must match.
type idempotency struct {
	key, fingerprint string
}

// newIdempotency checks a mutation's key (nil: none) and fingerprints the request, which
// must be given without its key; a malformed key is a BAD_USER_INPUT problem on it.
func newIdempotency(pr auth.Principal, key *string, mutation string, req any) (idempotency, error) {
	if key == nil {
		return idempotency{}, nil
	}
	k := *key
	valid := len(k) >= 1 && len(k) <= maxIdempotencyKey
	for _, c := range []byte(k) {
		if c < 0x21 || c > 0x7e {
			valid = false
		}
	}
	if !valid {
		var p problems
		p.add(CodeBadUserInput, path("idempotencyKey"), "an idempotency key is 1 to %d printable ASCII characters without spaces", maxIdempotencyKey)
		return idempotency{}, p.err()
	}
	body, err := json.Marshal(req)
	if err != nil {
		panic(err) // requests are plain data: they always encode
	}
	keySum := sha256.Sum256([]byte(pr.Subject + "\x00" + k))
	reqSum := sha256.Sum256(append([]byte(mutation+"\x00"), body...))
	return idempotency{key: hex.EncodeToString(keySum[:]), fingerprint: hex.EncodeToString(reqSum[:16])}, nil
}

// record is what the write records under the key: the fingerprint and the instance's id.
func (i idempotency) record(id string) Idempotency {
	if i.key == "" {
		return Idempotency{}
	}
	return Idempotency{Key: i.key, Value: i.fingerprint + " " + id}
}

// recordWith is record with what a retry is answered from besides the instance (a console
// session), kept for ttl.
func (i idempotency) recordWith(id, answer string, ttl time.Duration) Idempotency {
	rec := i.record(id)
	if rec.Key != "" {
		rec.Value += " " + answer
		rec.TTL = ttl
	}
	return rec
}

// forget is what a write that undoes the key's change passes: the key goes with it.
func (i idempotency) forget() Idempotency {
	if i.key == "" {
		return Idempotency{}
	}
	return Idempotency{Key: i.key, Forget: true}
}

// replayOf reads what a recorded key says: the id of the instance the first call made or
// changed, or CONFLICT when the key was used for another request.
func (i idempotency) replayOf(recorded string) (string, error) {
	id, _, err := i.replayWith(recorded)
	return id, err
}

// replayWith is replayOf that also returns what recordWith recorded besides the id.
func (i idempotency) replayWith(recorded string) (id, answer string, err error) {
	fingerprint, rest, _ := strings.Cut(recorded, " ")
	id, answer, _ = strings.Cut(rest, " ")
	if fingerprint != i.fingerprint {
		var p problems
		p.add(CodeConflict, path("idempotencyKey"), "this idempotency key was used in the last 24 hours for a different request: use a new key for a new request")
		return "", "", p.err()
	}
	return id, answer, nil
}

// replayIn answers a retried call from what its key records in the organization: done is
// false when the key records nothing (or there is no key), and the call goes on.
func (s *Service) replayIn(ctx context.Context, pr auth.Principal, org string, i idempotency) (inst *Instance, done bool, err error) {
	prior, err := s.recorded(ctx, org, i)
	if err != nil || prior == "" {
		return nil, err != nil, err
	}
	inst, err = s.replay(ctx, pr, i, prior)
	return inst, true, err
}

// recorded returns what the key records in the organization, "" for nothing (or no key).
func (s *Service) recorded(ctx context.Context, org string, i idempotency) (string, error) {
	if i.key == "" {
		return "", nil
	}
	v, err := s.store.Idempotent(ctx, org, i.key)
	if err != nil {
		return "", internal("idempotency key", err)
	}
	return v, nil
}

// replay answers a retried call from what its key recorded: the instance as it is now, or
// nil when it is gone since (a delete that completed).
func (s *Service) replay(ctx context.Context, pr auth.Principal, i idempotency, recorded string) (*Instance, error) {
	id, err := i.replayOf(recorded)
	if err != nil {
		return nil, err
	}
	inst, err := s.peek(ctx, pr, id, auth.RoleViewer)
	if CodeOf(err) == CodeNotFound {
		return nil, nil
	}
	return inst, err
}
