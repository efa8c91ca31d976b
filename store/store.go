// Package store keeps instances in Redis, the store of record. Every multi-key change is one
// Lua script whose keys share the organization's hash tag, so the same code runs on a single
// Redis and on Redis Cluster, and a crash leaves a change either whole or absent. (On a single
// Redis, a create's script also takes the queue's keys, to enqueue the instance's work.)
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/queue"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/roundtrip"
)

// Store is the Redis implementation of instance.Store.
type Store struct {
	rdb redis.UniversalClient
	// creates carries the creates' pipelines: many at once share round trips.
	creates *roundtrip.Shared[redis.Pipeliner]
	// queue, when set, has a create's script enqueue the new instance's work.
	queue Enqueuer
}

// Enqueuer gives the enqueue of a key for a script of the store's to make (queue.Queue).
type Enqueuer interface {
	Addition(ctx context.Context, key string) (queue.Addition, error)
}

// Option configures a Store.
type Option func(*Store)

// WithQueue makes CreateQueued enqueue a new instance's work in the create's script, where
// the script can reach the queue's keys (a standalone Redis).
func WithQueue(q Enqueuer) Option { return func(s *Store) { s.queue = q } }

var _ instance.Store = (*Store)(nil)

// createTrips bounds the create round trips a Store has under way: up to it, each create makes
// its own; past it, the creates that wait share the next one, in one pipeline (see roundtrip).
const createTrips = 4

// sendTogether sends the commands of several creates' pipelines in one; each command holds its
// reply or error afterwards.
func (s *Store) sendTogether(ctx context.Context, pipes []redis.Pipeliner) {
	all := s.rdb.Pipeline()
	for _, p := range pipes {
		_ = all.BatchProcess(ctx, p.Cmds()...)
	}
	_, _ = all.Exec(ctx)
}

// New returns a store on the client. LimitCalls applies to it once the client has
// CallLimitHook, which whoever makes the client adds once.
func New(rdb redis.UniversalClient, opts ...Option) *Store {
	s := &Store{rdb: rdb}
	s.creates = roundtrip.Share(createTrips, func(ctx context.Context, p redis.Pipeliner) { _, _ = p.Exec(ctx) }, s.sendTogether)
	for _, o := range opts {
		o(s)
	}
	return s
}

// Load loads every script into Redis, so that the first calls go by SHA; it also proves
// Redis is reachable and runs Lua.
func (s *Store) Load(ctx context.Context) error {
	for _, sc := range scripts {
		if err := sc.Load(ctx, s.rdb).Err(); err != nil {
			return failed("load scripts", err)
		}
	}
	return nil
}

// chargeArgs appends a charge in quotaLua's ARGV form: n, then kind, amount, default limit.
func chargeArgs(args []any, amounts, limits quota.Amounts) []any {
	n := 0
	for _, k := range quota.Kinds {
		if amounts[k] != 0 {
			n++
		}
	}
	args = append(args, n)
	for _, k := range quota.Kinds {
		if amounts[k] != 0 {
			args = append(args, string(k), amounts[k], limits[k])
		}
	}
	return args
}

// Event log bounds, per organization (see eventLua).
const (
	eventsKept      = 10_000
	eventsKeptBytes = 16 << 20
	// eventsTrimmed and eventsTrimmedBytes are how far below its bounds a trim takes the log,
	// eventsTrimRead the most entries one reads (see eventLua).
	eventsTrimmed      = 64
	eventsTrimmedBytes = eventsKeptBytes / 64
	eventsTrimRead     = 2 * eventsTrimmed
	// eventOverhead is what Redis spends on an entry beyond its fields' bytes, counted with
	// them so that the bytes bound holds for many small events too.
	eventOverhead = 64
	// historyKept is how many events an instance's history index keeps; it is trimmed back to
	// that when historyTrimmed more have come, a batch at a time like the log.
	historyKept    = 1_000
	historyTrimmed = 64
	// deletedKept is how many deleted instances per organization keep their history.
	deletedKept = 1_000
)

// encodeSpec returns the spec without its large fields, and those fields as the hash holds
// them: description and user data as they are, tags as JSON.
func encodeSpec(spec *instance.Spec) (specJSON []byte, large [3]any, err error) {
	small, l := instance.SplitLarge(*spec)
	specJSON, err1 := small.AppendJSON(make([]byte, 0, 512))
	tags := []byte("")
	var err2 error
	if len(l.Tags) > 0 {
		tags, err2 = json.Marshal(l.Tags)
	}
	return specJSON, [3]any{l.Description, tags, l.UserData}, errors.Join(err1, err2)
}

// largeFields are the hash fields of the large fields, in instance.LargeField order.
var largeFields = [...]string{"description", "tags", "userData"}

// decodeLarge sets the large field from its value in the hash.
func decodeLarge(field instance.LargeField, v string, l *instance.LargeFields) error {
	switch field {
	case instance.FieldDescription:
		l.Description = v
	case instance.FieldTags:
		if v != "" {
			return json.Unmarshal([]byte(v), &l.Tags)
		}
	case instance.FieldUserData:
		if v != "" {
			l.UserData = []byte(v)
		}
	}
	return nil
}

// eventKeys are the keys every script that appends an event to the log takes last.
func eventKeys(org, id string) []string {
	return []string{eventsKey(org), eventBytesKey(org), historyKey(org, id)}
}

// Create implements instance.Store with createScript.
func (s *Store) Create(ctx context.Context, inst *instance.Instance, claim string, limits quota.Amounts, idem instance.Idempotency) (*instance.Refusal, error) {
	r, _, err := s.create(ctx, inst, claim, limits, idem, nil)
	return r, err
}

// CreateQueued implements instance.Store: with a queue whose keys the create script can reach,
// the script also enqueues the instance's work key, only if it stores the instance: one script
// call, in one round trip. On a Redis Cluster the queue's keys are on other shards, and the
// caller enqueues.
func (s *Store) CreateQueued(ctx context.Context, inst *instance.Instance, claim string, limits quota.Amounts, idem instance.Idempotency) (*instance.Refusal, bool, error) {
	return s.create(ctx, inst, claim, limits, idem, s.queue)
}

// create runs createScript, enqueueing too when q is set and reachable, through the shared
// pipeline: concurrent creates share round trips.
func (s *Store) create(ctx context.Context, inst *instance.Instance, claim string, limits quota.Amounts, idem instance.Idempotency, q Enqueuer) (*instance.Refusal, bool, error) {
	keys, args, err := createCall(inst, claim, limits, idem)
	if err != nil {
		return nil, false, err
	}
	enqueues := false
	if q != nil {
		if add, err := q.Addition(ctx, inst.Key()); err == nil {
			keys, args, enqueues = append(keys, add.Keys...), append(args, add.Args...), true
		}
	}
	pipe := s.rdb.Pipeline() // s.creates sends it, alone or with others
	created := createScript.EvalSha(ctx, pipe, keys, args...)
	if err := s.creates.Do(ctx, pipe); err != nil {
		return nil, false, failed("create", err)
	}
	if redis.HasErrorPrefix(created.Err(), "NOSCRIPT") {
		created = createScript.Run(ctx, s.rdb, keys, args...) // and loads it for the next
	}
	reply, err := created.StringSlice()
	if err != nil {
		return nil, false, failed("create", err)
	}
	if len(reply) == 1 && reply[0] == "unqueued" {
		return nil, false, nil
	}
	r, err := parseRefusals(reply)
	return r, enqueues && err == nil && r == nil, err
}

// createCall is createScript's keys and arguments for the instance.
func createCall(inst *instance.Instance, claim string, limits quota.Amounts, idem instance.Idempotency) ([]string, []any, error) {
	spec, large, err := encodeSpec(&inst.Spec)
	if err != nil {
		return nil, nil, fmt.Errorf("create: encode spec: %w", err)
	}
	status, err := inst.Status.AppendJSON(make([]byte, 0, 256))
	if err != nil {
		return nil, nil, fmt.Errorf("create: encode status: %w", err)
	}
	org := inst.OrganizationID
	keys := append([]string{
		claimKey(org, claim), instanceKey(org, inst.ID), orgIndexKey(org),
		projectIndexKey(org, inst.ProjectID), quotaKey(org),
	}, eventKeys(org, inst.ID)...)
	keys = append(keys, idemKey(org, idem.Key))
	args := chargeArgs([]any{inst.ID, spec, status, inst.ProjectID, inst.CreatedAt.UnixMilli(), large[0], large[1], large[2],
		idemValue(idem), idemTTL(idem)}, inst.Charge, limits)
	return keys, args, nil
}

// UpdateSpec implements instance.Store with updateSpecScript.
func (s *Store) UpdateSpec(ctx context.Context, inst *instance.Instance, delta, limits quota.Amounts, status *instance.Status, changed []string, idem instance.Idempotency) (*instance.Refusal, error) {
	return s.updateSpec(ctx, inst, delta, limits, status, changed, instance.EventUpdated, instance.ActionEvent{}, idem)
}

// idemTTLSeconds is how long an idempotency key is remembered: a day, as the API promises.
const idemTTLSeconds = 24 * 60 * 60

// idemTTL is how long the key is remembered, in whole seconds: its own time to live (rounded
// up), or a day.
func idemTTL(idem instance.Idempotency) int64 {
	if idem.TTL > 0 {
		return int64((idem.TTL + time.Second - 1) / time.Second)
	}
	return idemTTLSeconds
}

// idemValue is what a script is given for the key: what it records, or idemForget.
func idemValue(idem instance.Idempotency) string {
	if idem.Forget {
		return idemForget
	}
	return idem.Value
}

// Idempotent implements instance.Store.
func (s *Store) Idempotent(ctx context.Context, org, key string) (string, error) {
	v, err := s.rdb.Get(ctx, idemKey(org, key)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", failed("idempotency key", err)
	}
	return v, nil
}

// Act implements instance.Store: with changed fields it writes the spec like UpdateSpec, with
// an ACTION event instead of UPDATED; without, it only records the event.
func (s *Store) Act(ctx context.Context, inst *instance.Instance, changed []string, ev instance.ActionEvent) (*instance.Refusal, error) {
	if len(changed) > 0 {
		return s.updateSpec(ctx, inst, nil, nil, nil, changed, instance.EventAction, ev, ev.Idem)
	}
	reply, err := s.noteIdem(ctx, inst, instance.EventAction, ev)
	switch {
	case err != nil:
		return nil, err
	case len(reply) == 2 && reply[0] == "replay":
		return &instance.Refusal{Replayed: reply[1]}, nil
	case len(reply) == 1 && reply[0] == "gone":
		return &instance.Refusal{Gone: true}, nil
	}
	return nil, nil
}

// Resize implements instance.Store: UpdateSpec with the ACTION event instead of UPDATED.
func (s *Store) Resize(ctx context.Context, inst *instance.Instance, delta, limits quota.Amounts, changed []string, ev instance.ActionEvent) (*instance.Refusal, error) {
	return s.updateSpec(ctx, inst, delta, limits, nil, changed, instance.EventAction, ev, ev.Idem)
}

func (s *Store) updateSpec(ctx context.Context, inst *instance.Instance, delta, limits quota.Amounts, status *instance.Status, changed []string, kind instance.EventKind, ev instance.ActionEvent, idem instance.Idempotency) (*instance.Refusal, error) {
	spec, large, err := encodeSpec(&inst.Spec)
	if err != nil {
		return nil, fmt.Errorf("update spec: encode spec: %w", err)
	}
	expectSV, statusJSON := "", []byte("")
	if status != nil {
		expectSV = strconv.FormatInt(inst.StatusVersion, 10)
		if statusJSON, err = status.AppendJSON(make([]byte, 0, 256)); err != nil {
			return nil, fmt.Errorf("update spec: encode status: %w", err)
		}
	}
	at := inst.UpdatedAt
	if kind == instance.EventAction {
		at = ev.At
	}
	org := inst.OrganizationID
	keys := append([]string{instanceKey(org, inst.ID), quotaKey(org)}, eventKeys(org, inst.ID)...)
	keys = append(keys, idemKey(org, idem.Key))
	args := chargeArgs([]any{inst.Generation, spec, expectSV, statusJSON, inst.ID, strings.Join(changed, ","), at.UnixMilli(),
		string(kind), ev.Actor, string(ev.Action), string(ev.Outcome), instance.BoundMessage(ev.Message), large[0], large[1], large[2],
		idemValue(idem), idemTTL(idem)}, delta, limits)
	reply, err := updateSpecScript.Run(ctx, s.rdb, keys, args...).StringSlice()
	if err != nil {
		return nil, failed("update spec", err)
	}
	if len(reply) == 1 {
		switch reply[0] {
		case "ok":
			return nil, nil
		case "gone":
			return &instance.Refusal{Gone: true}, nil
		case "stale":
			return &instance.Refusal{Stale: true}, nil
		case "statusstale":
			return &instance.Refusal{StatusStale: true}, nil
		}
	}
	return parseRefusals(reply)
}

// WriteStatus writes the status with writeStatusScript if the stored status version is still
// inst.StatusVersion, and then increases it; the generation is not compared, so a status
// written for an older spec is kept (its ObservedGeneration says which spec it realised).
// written is false, with no error, when the status version moved on or the instance is gone:
// a stale writer never overwrites a newer status. inst is not changed.
func (s *Store) WriteStatus(ctx context.Context, inst *instance.Instance, status instance.Status, ev instance.Event) (written bool, err error) {
	statusJSON, err := status.AppendJSON(make([]byte, 0, 256))
	if err != nil {
		return false, fmt.Errorf("write status: encode status: %w", err)
	}
	keys := append([]string{instanceKey(inst.OrganizationID, inst.ID)}, eventKeys(inst.OrganizationID, inst.ID)...)
	reply, err := writeStatusScript.Run(ctx, s.rdb, keys, inst.StatusVersion, statusJSON, inst.ID,
		string(ev.Kind), strings.Join(ev.Changed, ","), ev.At.UnixMilli(), instance.BoundMessage(ev.Message)).Int()
	if err != nil {
		return false, failed("write status", err)
	}
	return reply == 1, nil
}

// Forget is the last stage of deprovisioning, for once the backing server is gone: with
// forgetScript it releases inst.Charge, frees the name claim if it still holds inst.ID,
// deletes the instance and removes it from the organization and project indexes, all in one
// step, if the stored generation is still inst.Generation. It returns false, having changed
// nothing, when the instance is gone (e.g. already forgotten) or its generation moved on.
func (s *Store) Forget(ctx context.Context, inst *instance.Instance, at time.Time) (bool, error) {
	org := inst.OrganizationID
	keys := append([]string{
		instanceKey(org, inst.ID), claimKey(org, instance.NameClaim(inst.NetworkID, inst.Name)),
		orgIndexKey(org), projectIndexKey(org, inst.ProjectID), quotaKey(org),
	}, eventKeys(org, inst.ID)...)
	keys = append(keys, deletedKey(org), deletedOrderKey(org))
	// Releasing is charging the negated amounts; limits only matter for positive amounts.
	args := chargeArgs([]any{inst.Generation, inst.ID, at.UnixMilli()}, quota.Amounts{}.Sub(inst.Charge), nil)
	reply, err := forgetScript.Run(ctx, s.rdb, keys, args...).Int()
	if err != nil {
		return false, failed("forget", err)
	}
	return reply == 1, nil
}

// parseRefusals reads the refusal list the scripts return; an empty list is success.
func parseRefusals(reply []string) (*instance.Refusal, error) {
	if len(reply) == 0 {
		return nil, nil
	}
	if len(reply) == 2 && reply[0] == "replay" {
		return &instance.Refusal{Replayed: reply[1]}, nil
	}
	r := &instance.Refusal{}
	for i := 0; i < len(reply); {
		switch {
		case reply[i] == "name":
			r.NameTaken = true
			i++
		case reply[i] == "quota" && i+3 < len(reply):
			requested, err1 := strconv.ParseInt(reply[i+2], 10, 64)
			limit, err2 := strconv.ParseInt(reply[i+3], 10, 64)
			if err := errors.Join(err1, err2); err != nil {
				return nil, fmt.Errorf("malformed quota refusal %q: %w", reply[i:i+4], err)
			}
			r.Exceeded = append(r.Exceeded, instance.Excess{Kind: quota.Kind(reply[i+1]), Requested: requested, Limit: limit})
			i += 4
		default:
			return nil, fmt.Errorf("unexpected script reply %q", reply)
		}
	}
	return r, nil
}

// instanceFields are what a read of a whole instance reads. peekFields, what reads that serve
// the API read, leave out the tags and user data (up to 64 and 44 KB) but keep the
// description (at most 4 KB), which every listing shows: a page would otherwise cost a round
// trip per instance for it. headFields are the fields every read has.
var (
	instanceFields = []string{"spec", "status", "gen", "sv", "proj", "v", "description", "tags", "userData"}
	peekFields     = instanceFields[:7]
	headFields     = instanceFields[:6]
)

// ClaimOwner implements instance.Store.
func (s *Store) ClaimOwner(ctx context.Context, org, claim string) (string, error) {
	id, err := s.rdb.Get(ctx, claimKey(org, claim)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", failed("read name claim", err)
	}
	return id, nil
}

// Warn records a warning event on the instance's history; false when the instance is gone.
func (s *Store) Warn(ctx context.Context, inst *instance.Instance, at time.Time, message string) (bool, error) {
	return s.note(ctx, inst, instance.EventWarning, instance.ActionEvent{At: at, Message: message})
}

// note records an event that changes nothing with noteScript; false when the instance is gone.
func (s *Store) note(ctx context.Context, inst *instance.Instance, kind instance.EventKind, ev instance.ActionEvent) (bool, error) {
	reply, err := s.noteIdem(ctx, inst, kind, ev)
	return err == nil && len(reply) == 1 && reply[0] == "ok", err
}

// noteIdem runs noteScript, with the action's idempotency key, and returns its reply.
func (s *Store) noteIdem(ctx context.Context, inst *instance.Instance, kind instance.EventKind, ev instance.ActionEvent) ([]string, error) {
	org := inst.OrganizationID
	keys := append([]string{instanceKey(org, inst.ID)}, eventKeys(org, inst.ID)...)
	keys = append(keys, idemKey(org, ev.Idem.Key))
	reply, err := noteScript.Run(ctx, s.rdb, keys, inst.ID, ev.At.UnixMilli(), string(kind), instance.BoundMessage(ev.Message),
		ev.Actor, string(ev.Action), string(ev.Outcome), idemValue(ev.Idem), idemTTL(ev.Idem)).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("record %s event: %w", strings.ToLower(string(kind)), err)
	}
	return reply, nil
}

// readBatch is how many events ReadEvents returns at most per call.
const readBatch = 500

// History implements instance.Store from the instance's history index with historyScript:
// one round trip, whose work is the page's whatever the length of the organization's log.
func (s *Store) History(ctx context.Context, org, id, after string, limit int) ([]instance.Record, bool, error) {
	reply, err := historyScript.Run(ctx, s.rdb, []string{eventsKey(org), historyKey(org, id), legacyHistoryKey(org, id)}, after, limit).Slice()
	if err != nil {
		return nil, false, failed("history", err)
	}
	if len(reply) == 1 && reply[0] == "expired" {
		return nil, false, instance.ErrCursorExpired
	}
	more, _ := reply[0].(int64)
	msgs := make([]redis.XMessage, 0, len(reply)-1)
	for _, e := range reply[1:] {
		m, err := scriptEntry(e)
		if err != nil {
			return nil, false, fmt.Errorf("history: %w", err)
		}
		msgs = append(msgs, m)
	}
	out, err := s.decodeRecords(org, msgs)
	return out, more == 1, err
}

// scriptEntry reads a stream entry as a script returns it: {id, {field, value, ...}}.
func scriptEntry(e any) (redis.XMessage, error) {
	pair, ok := e.([]any)
	if !ok || len(pair) != 2 {
		return redis.XMessage{}, fmt.Errorf("unexpected stream entry %v", e)
	}
	id, _ := pair[0].(string)
	kv, ok := pair[1].([]any)
	if id == "" || !ok || len(kv)%2 != 0 {
		return redis.XMessage{}, fmt.Errorf("unexpected stream entry %v", e)
	}
	m := redis.XMessage{ID: id, Values: make(map[string]any, len(kv)/2)}
	for i := 0; i < len(kv); i += 2 {
		k, _ := kv[i].(string)
		m.Values[k] = kv[i+1]
	}
	return m, nil
}

// PutTicket implements instance.Store.
func (s *Store) PutTicket(ctx context.Context, ticket string, p auth.Principal, ttl time.Duration) error {
	return s.putOnce(ctx, "put ticket", ticketKey(ticket), p, ttl)
}

// TakeTicket implements instance.Store: a ticket is redeemed once.
func (s *Store) TakeTicket(ctx context.Context, ticket string) (auth.Principal, error) {
	var p auth.Principal
	return p, s.takeOnce(ctx, "take ticket", ticketKey(ticket), &p, instance.ErrNoTicket)
}

// PutConsoleGrant implements instance.Store.
func (s *Store) PutConsoleGrant(ctx context.Context, token string, g instance.ConsoleGrant, ttl time.Duration) error {
	return s.putOnce(ctx, "put console grant", consoleKey(token), g, ttl)
}

// TakeConsoleGrant implements instance.Store: a console token is redeemed once.
func (s *Store) TakeConsoleGrant(ctx context.Context, token string) (instance.ConsoleGrant, error) {
	var g instance.ConsoleGrant
	return g, s.takeOnce(ctx, "take console grant", consoleKey(token), &g, instance.ErrNoConsoleSession)
}

// putOnce keeps v as JSON under key for ttl, for takeOnce to read once.
func (s *Store) putOnce(ctx context.Context, op, key string, v any, ttl time.Duration) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := s.rdb.Set(ctx, key, b, ttl).Err(); err != nil {
		return failed(op, err)
	}
	return nil
}

// takeOnce reads what putOnce kept under key into v and deletes it, in one GETDEL: of two
// callers, one gets it and the other none, which is an error wrapping none.
func (s *Store) takeOnce(ctx context.Context, op, key string, v any, none error) error {
	b, err := s.rdb.GetDel(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return none
	}
	if err != nil {
		return failed(op, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// Deleted implements instance.Store: one pipelined round trip over the organizations.
func (s *Store) Deleted(ctx context.Context, orgs []string, id string) (org, project string, err error) {
	cmds := make([]*redis.StringCmd, len(orgs))
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, org := range orgs {
			cmds[i] = p.HGet(ctx, deletedKey(org), id)
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return "", "", failed("deleted instance", err)
	}
	for i, cmd := range cmds {
		if project, err := cmd.Result(); err == nil {
			return orgs[i], project, nil
		}
	}
	return "", "", instance.ErrNotFound
}

// LastEvent returns the position of the organization's newest event, "0-0" when it has none:
// where a live reader starts.
func (s *Store) LastEvent(ctx context.Context, org string) (string, error) {
	msgs, err := s.rdb.XRevRangeN(ctx, eventsKey(org), "+", "-", 1).Result()
	if err != nil {
		return "", failed("last event", err)
	}
	if len(msgs) == 0 {
		return "0-0", nil
	}
	return msgs[0].ID, nil
}

// ReadEvents waits up to block for events of the organization after the position and returns
// them (none when the wait ends), oldest first.
func (s *Store) ReadEvents(ctx context.Context, org, after string, block time.Duration) ([]instance.Record, error) {
	streams, err := s.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{eventsKey(org), after}, Count: readBatch, Block: block}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, failed("read events", err)
	}
	return s.decodeRecords(org, streams[0].Messages)
}

// EventsBetween returns the organization's events after one position up to another, oldest
// first; ErrCursorExpired when the log was trimmed past the first.
func (s *Store) EventsBetween(ctx context.Context, org, after, upTo string) ([]instance.Record, error) {
	if err := s.checkKept(ctx, org, after); err != nil {
		return nil, failed("events between", err)
	}
	if !instance.PositionLess(after, upTo) {
		return nil, nil
	}
	msgs, err := s.rdb.XRange(ctx, eventsKey(org), "("+after, upTo).Result()
	if err != nil {
		return nil, failed("events between", err)
	}
	return s.decodeRecords(org, msgs)
}

// checkKept returns instance.ErrCursorExpired when the organization's log no longer reaches
// back to the position: the cursor named an entry that existed, so if the oldest kept is
// later, the log was trimmed past it and events may be missing.
func (s *Store) checkKept(ctx context.Context, org, pos string) error {
	first, err := s.rdb.XRangeN(ctx, eventsKey(org), "-", "+", 1).Result()
	if err != nil {
		return err
	}
	if len(first) == 1 && instance.PositionLess(pos, first[0].ID) {
		return instance.ErrCursorExpired
	}
	return nil
}

func (s *Store) decodeRecords(org string, msgs []redis.XMessage) ([]instance.Record, error) {
	out := make([]instance.Record, 0, len(msgs))
	for _, m := range msgs {
		r, err := s.decodeRecord(org, m)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// decodeRecord reads an event entry appended by eventLua. Its instance has no large fields
// (records of schema version 3 on do not copy them into events): they are read from the
// instance, when asked for.
func (s *Store) decodeRecord(org string, m redis.XMessage) (instance.Record, error) {
	str := func(k string) string { s, _ := m.Values[k].(string); return s }
	id := str("id")
	inst, err := decode(org, id, []any{m.Values["spec"], m.Values["status"], m.Values["gen"], m.Values["sv"], m.Values["proj"], m.Values["v"]})
	if err != nil {
		return instance.Record{}, fmt.Errorf("decode event %s: %w", m.ID, err)
	}
	if inst == nil {
		return instance.Record{}, fmt.Errorf("decode event %s: it carries no instance", m.ID)
	}
	if v, _ := recordVersion(str("v")); v >= largeSplitVersion {
		s.loadLargeOnDemand(inst)
	}
	ms, err := strconv.ParseInt(str("at"), 10, 64)
	if err != nil {
		return instance.Record{}, fmt.Errorf("decode event %s: %w", m.ID, err)
	}
	r := instance.Record{
		Cursor: m.ID, Kind: instance.EventKind(str("kind")), Instance: inst, At: time.UnixMilli(ms).UTC(), Message: str("msg"),
		Actor: str("actor"), Action: instance.Action(str("action")), Outcome: instance.Code(str("outcome")),
	}
	if c := str("changed"); c != "" {
		r.Changed = strings.Split(c, ",")
	}
	return r, nil
}

// loadLargeOnDemand makes Large read the instance's current large fields, one at a time,
// but those read already.
func (s *Store) loadLargeOnDemand(inst *instance.Instance, read ...instance.LargeField) {
	key := instanceKey(inst.OrganizationID, inst.ID)
	inst.LoadLargeWith(func(ctx context.Context, field instance.LargeField, l *instance.LargeFields) error {
		v, err := s.rdb.HGet(ctx, key, largeFields[field]).Result()
		if errors.Is(err, redis.Nil) {
			return nil
		}
		if err != nil {
			return failed("read "+largeFields[field], err)
		}
		if err := decodeLarge(field, v, l); err != nil {
			return fmt.Errorf("decode %s of %s: %w", largeFields[field], key, err)
		}
		return nil
	}, read...)
}

// Exists reports whether the instance exists, reading nothing of it.
func (s *Store) Exists(ctx context.Context, org, id string) (bool, error) {
	n, err := s.rdb.Exists(ctx, instanceKey(org, id)).Result()
	if err != nil {
		return false, failed("instance exists", err)
	}
	return n == 1, nil
}

// Get implements instance.Store: one pipelined round trip over the organizations.
func (s *Store) Get(ctx context.Context, orgs []string, id string) (*instance.Instance, error) {
	return s.get(ctx, orgs, id, instanceFields)
}

// Peek implements instance.Store: Get without the large fields, read when asked for.
func (s *Store) Peek(ctx context.Context, orgs []string, id string) (*instance.Instance, error) {
	inst, err := s.get(ctx, orgs, id, peekFields)
	if inst != nil {
		s.loadLargeOnDemand(inst, instance.FieldDescription)
	}
	return inst, err
}

func (s *Store) get(ctx context.Context, orgs []string, id string, fields []string) (*instance.Instance, error) {
	if len(orgs) == 0 {
		return nil, instance.ErrNotFound
	}
	cmds := make([]*redis.SliceCmd, len(orgs))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, org := range orgs {
			cmds[i] = p.HMGet(ctx, instanceKey(org, id), fields...)
		}
		return nil
	})
	if err != nil {
		return nil, failed("get instance", err)
	}
	for i, cmd := range cmds {
		inst, err := decode(orgs[i], id, cmd.Val())
		if err != nil || inst != nil {
			return inst, err
		}
	}
	return nil, instance.ErrNotFound
}

// decode builds an instance from HMGET of instanceFields, or of a prefix of them (the large
// fields not read left empty); nil when the hash does not exist.
func decode(org, id string, vals []any) (*instance.Instance, error) {
	if len(vals) < len(headFields) || vals[0] == nil {
		return nil, nil
	}
	str := func(i int) string { s, _ := vals[i].(string); return s }
	inst := &instance.Instance{ID: id, OrganizationID: org, ProjectID: str(4)}
	errs := []error{
		json.Unmarshal([]byte(str(0)), &inst.Spec),
		json.Unmarshal([]byte(str(1)), &inst.Status),
	}
	var err error
	inst.Generation, err = strconv.ParseInt(str(2), 10, 64)
	errs = append(errs, err)
	inst.StatusVersion, err = strconv.ParseInt(str(3), 10, 64)
	errs = append(errs, err)
	_, err = recordVersion(str(5))
	errs = append(errs, err)
	// The large fields read, in largeFields order; a record of a version before
	// largeSplitVersion has no such fields (they are in spec), and they read as nil.
	if extra := vals[len(headFields):]; len(extra) > 0 && extra[0] != nil {
		var l instance.LargeFields
		for f, v := range extra {
			s, _ := v.(string)
			errs = append(errs, decodeLarge(instance.LargeField(f), s, &l))
		}
		inst.SetLarge(l)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("decode instance %s/%s: %w", org, id, err)
	}
	return inst, nil
}

func indexKey(org, project string) string {
	if project != "" {
		return projectIndexKey(org, project)
	}
	return orgIndexKey(org)
}

// List implements instance.Store: a range of the index, then the instances without their
// large fields in one pipeline.
func (s *Store) List(ctx context.Context, org, project, after string, limit int) ([]*instance.Instance, error) {
	return s.list(ctx, org, project, after, limit, peekFields)
}

// ListWhole is List with every instance read whole, large fields included, in the same one
// pipeline: for a reader that needs them all, where reading each later would cost a round
// trip per instance.
func (s *Store) ListWhole(ctx context.Context, org, project, after string, limit int) ([]*instance.Instance, error) {
	return s.list(ctx, org, project, after, limit, instanceFields)
}

func (s *Store) list(ctx context.Context, org, project, after string, limit int, fields []string) ([]*instance.Instance, error) {
	start := "-"
	if after != "" {
		start = "(" + after
	}
	ids, err := s.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{
		Key: indexKey(org, project), Start: start, Stop: "+", ByLex: true, Count: int64(limit),
	}).Result()
	if err != nil {
		return nil, failed("list instances", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.SliceCmd, len(ids))
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HMGet(ctx, instanceKey(org, id), fields...)
		}
		return nil
	}); err != nil {
		return nil, failed("list instances", err)
	}
	out := make([]*instance.Instance, 0, len(ids))
	for i, cmd := range cmds {
		inst, err := decode(org, ids[i], cmd.Val())
		if err != nil {
			return nil, err
		}
		// An instance forgotten between the two round trips is simply no longer listed.
		if inst != nil {
			if len(fields) < len(instanceFields) {
				s.loadLargeOnDemand(inst, instance.FieldDescription)
			}
			out = append(out, inst)
		}
	}
	return out, nil
}

// Count implements instance.Store.
func (s *Store) Count(ctx context.Context, org, project string) (int, error) {
	n, err := s.rdb.ZCard(ctx, indexKey(org, project)).Result()
	if err != nil {
		return 0, failed("count instances", err)
	}
	return int(n), nil
}

// Quota implements instance.Store.
func (s *Store) Quota(ctx context.Context, org string) (limits, used quota.Amounts, err error) {
	all, err := s.rdb.HGetAll(ctx, quotaKey(org)).Result()
	if err != nil {
		return nil, nil, failed("read quota", err)
	}
	limits, used = quota.Amounts{}, quota.Amounts{}
	for field, v := range all {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, nil, fmt.Errorf("read quota: field %s: %w", field, err)
		}
		if kind, ok := strings.CutPrefix(field, "limit:"); ok {
			limits[quota.Kind(kind)] = n
		} else if kind, ok := strings.CutPrefix(field, "used:"); ok {
			used[quota.Kind(kind)] = n
		}
	}
	return limits, used, nil
}

// SetLimits implements instance.Store.
func (s *Store) SetLimits(ctx context.Context, org string, limits quota.Amounts, idem instance.Idempotency) (string, error) {
	args := []any{idemValue(idem), idemTTL(idem)}
	for _, k := range quota.Kinds {
		if v, ok := limits[k]; ok {
			args = append(args, "limit:"+string(k), v)
		}
	}
	reply, err := setLimitsScript.Run(ctx, s.rdb, []string{quotaKey(org), idemKey(org, idem.Key)}, args...).StringSlice()
	if err != nil {
		return "", failed("set quota limits", err)
	}
	if len(reply) == 2 && reply[0] == "replay" {
		return reply[1], nil
	}
	return "", nil
}

// RecordKey implements instance.Store with recordKeyScript.
func (s *Store) RecordKey(ctx context.Context, org string, idem instance.Idempotency) (string, error) {
	if idem.Key == "" {
		return "", nil
	}
	reply, err := recordKeyScript.Run(ctx, s.rdb, []string{idemKey(org, idem.Key)}, idemValue(idem), idemTTL(idem)).StringSlice()
	if err != nil {
		return "", failed("record idempotency key", err)
	}
	if len(reply) == 2 && reply[0] == "replay" {
		return reply[1], nil
	}
	return "", nil
}

// failed wraps an error of a call to Redis. Conditions that pass (Redis loading its data after
// a restart, a replica that cannot take writes yet, a failover or a cluster slot moving, a
// full connection pool) also wrap instance.ErrStoreUnavailable, so that callers are told to
// retry rather than that their request is broken.
func failed(op string, err error) error {
	if transient(err) {
		return fmt.Errorf("%s: %w: %w", op, instance.ErrStoreUnavailable, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

func transient(err error) bool {
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsMasterDownError(err) ||
		redis.IsClusterDownError(err) || redis.IsTryAgainError(err) || redis.IsMaxClientsError(err) ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted)
}
