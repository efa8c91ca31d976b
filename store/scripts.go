package store

import (
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/queue"
)

// Scripts are loaded once at start (Store.Load) and called by SHA; go-redis falls back to
// EVAL when a restarted Redis has forgotten them.

// quotaLua is shared by every script that charges quota. A charge is given in ARGV from
// position first: n, then n triples of kind, amount and default limit (the limit used when
// none was set with setQuota).
//
// readCharge reads, in one HMGET, the usage of every kind the charge changes and the limit of
// every kind it raises. It returns the refusals, for each kind a positive amount would take
// over its limit the four entries "quota", kind, requested total, limit; and the usage after
// the charge, as HSET's field/value pairs, which applyCharge writes in one command. A script
// reads and applies in one run, so nothing changes the usage between the two.
const quotaLua = `
local function readCharge(quotaKey, first)
  -- Stored by index, not with table.insert: every create runs this, and a call of one of
  -- Lua's C functions costs more than the store it makes.
  -- at holds where each charged kind's triple starts in ARGV.
  local refusals, usage, at, amounts, fields = {}, {}, {}, {}, {}
  local n, nf = 0, 0
  for a = first + 1, first + 3 * tonumber(ARGV[first]), 3 do
    local amount = tonumber(ARGV[a + 1])
    if amount ~= 0 then
      n = n + 1
      at[n], amounts[n] = a, amount
      nf = nf + 1
      fields[nf] = 'used:' .. ARGV[a]
      if amount > 0 then
        nf = nf + 1
        fields[nf] = 'limit:' .. ARGV[a]
      end
    end
  end
  if n == 0 then
    return refusals, usage
  end
  local got, g, r = redis.call('HMGET', quotaKey, unpack(fields)), 1, 0
  for c = 1, n do
    local kind, used = ARGV[at[c]], tonumber(got[g] or '0') + amounts[c]
    g = g + 1
    if amounts[c] > 0 then
      local limit = tonumber(got[g] or ARGV[at[c] + 2])
      g = g + 1
      if used > limit then
        refusals[r + 1], refusals[r + 2], refusals[r + 3], refusals[r + 4] = 'quota', kind, tostring(used), tostring(limit)
        r = r + 4
      end
    end
    usage[2 * c - 1], usage[2 * c] = 'used:' .. kind, string.format('%d', used)
  end
  return refusals, usage
end

local function applyCharge(quotaKey, usage)
  if #usage > 0 then
    redis.call('HSET', quotaKey, unpack(usage))
  end
end
`

// eventLua appends an event to the organization's event stream from inside the script that
// commits the change, so there is no event without a change and no change without an event.
// The event carries the instance as stored after the change (or, for a deletion, before it),
// with the record's schema version, but never its large fields (description, tags, userData): an
// event is a few kilobytes whatever the instance holds. An ACTION event also carries who
// called which verb and its outcome.
//
// Each entry records its size in n, and the bytes key sums them: the log keeps at most
// eventsKept entries and eventsKeptBytes bytes per organization, the oldest dropped first.
// An append that takes the log over a bound drops a batch, eventsTrimmed entries (and enough
// bytes) below it, in one XRANGE and one exact XTRIM: the next appends find room and trim
// nothing. Trimming one entry per append cost Redis a seventh of a create's work, as XDEL
// scans its node from the start for each entry. Every append still does bounded work: it
// reads at most eventsTrimRead entries. The instance's history index gets the event's id, so
// that one instance's history is read without reading the organization's (it keeps between
// historyKept and historyKept+historyTrimmed).
var eventLua = historyLua + `
local function trimEvents(eventsKey, bytesKey, size)
  local total = redis.call('INCRBY', bytesKey, size)
  local len = redis.call('XLEN', eventsKey)
  if total <= ` + strconv.Itoa(eventsKeptBytes) + ` and len <= ` + strconv.Itoa(eventsKept) + ` then
    return
  end
  -- Every entry read is copied whole into Lua: only those the batch drops are read.
  local keepLen = ` + strconv.Itoa(eventsKept-eventsTrimmed) + `
  local count = ` + strconv.Itoa(eventsTrimRead) + `
  if total <= ` + strconv.Itoa(eventsKeptBytes-eventsTrimmedBytes) + ` then
    count = math.min(count, len - keepLen)
  end
  local cut, dropped = 0, 0
  for _, e in ipairs(redis.call('XRANGE', eventsKey, '-', '+', 'COUNT', tostring(count))) do
    if total - cut <= ` + strconv.Itoa(eventsKeptBytes-eventsTrimmedBytes) + ` and len - dropped <= keepLen then
      break
    end
    local fields = e[2]
    for i = 1, #fields, 2 do
      if fields[i] == 'n' then
        cut = cut + tonumber(fields[i + 1])
      end
    end
    dropped = dropped + 1
  end
  if dropped > 0 then
    redis.call('XTRIM', eventsKey, 'MAXLEN', tostring(len - dropped))
    redis.call('DECRBY', bytesKey, tostring(cut))
  end
end

-- appendEntry appends the event of the instance whose stored fields are f: spec, status, gen,
-- sv, proj and v, as appendEvent reads them, and returns its id.
local function appendEntry(eventsKey, bytesKey, f, id, kind, changed, at, msg, actor, action, outcome)
  local entry = {'kind', kind, 'id', id, 'proj', f[5], 'spec', f[1], 'status', f[2], 'gen', f[3], 'sv', f[4],
    'changed', changed, 'at', at, 'msg', msg, 'v', f[6] or '1'}
  if action and action ~= '' then
    for _, v in ipairs({'actor', actor, 'action', action, 'outcome', outcome}) do
      table.insert(entry, v)
    end
  end
  local size = ` + strconv.Itoa(eventOverhead) + `
  for i = 1, #entry do
    size = size + #entry[i]
  end
  -- Formatted once, as %d: a Lua number given to redis.call is formatted as %.17g, slower.
  local n = string.format('%d', size)
  table.insert(entry, 'n')
  table.insert(entry, n)
  local eid = redis.call('XADD', eventsKey, '*', unpack(entry))
  trimEvents(eventsKey, bytesKey, n)
  return eid
end

-- indexHistory adds the event to the history index of an instance that has one, keeping
-- between historyKept and historyKept+historyTrimmed. An index that this adds the first
-- member to belongs to an instance made before the index was a sorted set: its stream, the
-- key without its last byte, is moved in. (That key is not declared; it is touched only when
-- the declared sorted set was missing, and a Redis Cluster whose slot migrates redirects such
-- a call before it runs.)
local function indexHistory(histKey, eid)
  redis.call('ZADD', histKey, '0', historyMember(eid))
  local n = redis.call('ZCARD', histKey)
  if n == 1 then
    local legacy = string.sub(histKey, 1, -2)
    for _, e in ipairs(redis.call('XRANGE', legacy, '-', '+')) do
      redis.call('ZADD', histKey, '0', historyMember(e[1]))
    end
    redis.call('DEL', legacy)
    n = redis.call('ZCARD', histKey)
  end
  if n > ` + strconv.Itoa(historyKept+historyTrimmed) + ` then
    redis.call('ZREMRANGEBYRANK', histKey, '0', tostring(n - ` + strconv.Itoa(historyKept) + ` - 1))
  end
end

local function appendEvent(eventsKey, bytesKey, histKey, instKey, id, kind, changed, at, msg, actor, action, outcome)
  local f = redis.call('HMGET', instKey, 'spec', 'status', 'gen', 'sv', 'proj', 'v')
  indexHistory(histKey, appendEntry(eventsKey, bytesKey, f, id, kind, changed, at, msg, actor, action, outcome))
end
`

// historyLua writes an event id as a member of an instance's history index (historyKey): its
// two numbers right-aligned in 20 bytes each (a uint64's digits), so that members, all of
// score 0, sort bytewise as the ids do, and a page after an id is one ZRANGEBYLEX.
// historyID reads the id back.
const historyLua = `
local function historyMember(eid)
  local p = string.find(eid, '-', 1, true)
  return string.format('%20s-%20s', string.sub(eid, 1, p - 1), string.sub(eid, p + 1))
end

local function historyID(member)
  return (string.gsub(member, ' ', ''))
end
`

// idemLua records a mutation's idempotency key with the change it made, in the script that
// makes it: there is never a key without its change, nor a change without its key. priorIdem
// returns what a key records already (false for none, or no key). A write that undoes what a
// key recorded (a verb the region refused) passes idemForget, and the key goes with the undo.
// idemForget is the value a write passes to delete its idempotency key; a recorded value is a
// fingerprint, a space and an id, never this.
const idemForget = "forget"

const idemLua = `
local function priorIdem(key, value)
  if value == '' or value == '` + idemForget + `' then
    return false
  end
  return redis.call('GET', key)
end

local function recordIdem(key, value, ttl)
  if value == '` + idemForget + `' then
    redis.call('DEL', key)
  elseif value ~= '' then
    redis.call('SET', key, value, 'EX', ttl)
  end
end
`

// createScript stores a new instance, claims its name and charges its quota, all or nothing.
//
// With the queue's keys for the instance's work key after its own, it also enqueues that key
// (queue.Addition), only when it stores the instance. An enqueue that fails (a queue key of
// the wrong type) leaves the stored instance, which a script's error would not undo, and is
// answered {"unqueued"}: the create stands, and the caller enqueues.
//
// KEYS[1] claim, KEYS[2] instance, KEYS[3] org index, KEYS[4] project index, KEYS[5] quota,
// KEYS[6] events, KEYS[7] event bytes, KEYS[8] history index, KEYS[9] idempotency key,
// KEYS[10..12] the queue's (optional)
// ARGV[1] id, ARGV[2] spec JSON, ARGV[3] status JSON, ARGV[4] project, ARGV[5] now (Unix ms),
// ARGV[6..8] description, tags and user data, ARGV[9] what the idempotency key records (""
// for none), ARGV[10] its time to live in seconds, ARGV[11..] the charge, then, with the
// queue's keys, the queue's arguments
// Returns an empty array on success (a CREATED event appended), {"unqueued"} on success
// whose enqueue failed, {"replay", value} when the idempotency key records a write already,
// else the refusals: "name" when the claim is taken, and the quota refusals of readCharge.
var createScript = redis.NewScript(quotaLua + eventLua + idemLua + queue.EnqueueLua + `
local prior = priorIdem(KEYS[9], ARGV[9])
if prior then
  return {'replay', prior}
end
local refusals, usage = readCharge(KEYS[5], 11)
if #refusals > 0 then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    table.insert(refusals, 1, 'name')
  end
  return refusals
end
-- Claimed only if free: the claim is its own check when quota allows.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  return {'name'}
end
-- The record's fields as appendEvent reads them: the event is written from them.
local f = {ARGV[2], ARGV[3], '1', '1', ARGV[4], '` + strconv.Itoa(SchemaVersion) + `'}
redis.call('HSET', KEYS[2], 'spec', f[1], 'status', f[2], 'gen', f[3], 'sv', f[4], 'proj', f[5],
  'description', ARGV[6], 'tags', ARGV[7], 'userData', ARGV[8], 'v', f[6])
redis.call('ZADD', KEYS[3], '0', ARGV[1])
redis.call('ZADD', KEYS[4], '0', ARGV[1])
applyCharge(KEYS[5], usage)
-- A new instance's index is new: indexHistory's count, trim and move have nothing to do.
redis.call('ZADD', KEYS[8], '0', historyMember(appendEntry(KEYS[6], KEYS[7], f, ARGV[1], 'CREATED', '', ARGV[5], '')))
recordIdem(KEYS[9], ARGV[9], ARGV[10])
if KEYS[12] and not pcall(enqueue, KEYS[10], KEYS[11], KEYS[12], unpack(ARGV, 12 + 3 * tonumber(ARGV[11]))) then
  return {'unqueued'}
end
return refusals
`)

// updateSpecScript writes a new spec if the generation is unchanged and charges a quota
// delta; with an expected status version it also writes the status if that is unchanged.
// All or nothing.
//
// KEYS[1] instance, KEYS[2] quota, KEYS[3] events, KEYS[4] event bytes, KEYS[5] history index,
// KEYS[6] idempotency key
// ARGV[1] expected generation, ARGV[2] spec JSON,
// ARGV[3] expected status version ("" leaves the status alone), ARGV[4] status JSON,
// ARGV[5] id, ARGV[6] changed fields (comma-separated), ARGV[7] now (Unix ms),
// ARGV[8] event kind (UPDATED, or ACTION for a verb that changed the desired power),
// ARGV[9] actor, ARGV[10] action, ARGV[11] outcome, ARGV[12] event message,
// ARGV[13..15] description, tags and user data, ARGV[16] what the idempotency key records (""
// for none), ARGV[17] its time to live in seconds, ARGV[18..] the quota delta (negative
// amounts release)
// Returns {"ok"} (the event appended), {"replay", value}, {"gone"}, {"stale"},
// {"statusstale"}, or the quota refusals of readCharge.
var updateSpecScript = redis.NewScript(quotaLua + eventLua + idemLua + `
local prior = priorIdem(KEYS[6], ARGV[16])
if prior then
  return {'replay', prior}
end
local cur = redis.call('HMGET', KEYS[1], 'gen', 'sv')
if not cur[1] then
  return {'gone'}
end
if cur[1] ~= ARGV[1] then
  return {'stale'}
end
if ARGV[3] ~= '' and cur[2] ~= ARGV[3] then
  return {'statusstale'}
end
local refusals, usage = readCharge(KEYS[2], 18)
if #refusals > 0 then
  return refusals
end
redis.call('HSET', KEYS[1], 'spec', ARGV[2], 'description', ARGV[13], 'tags', ARGV[14], 'userData', ARGV[15])
redis.call('HINCRBY', KEYS[1], 'gen', '1')
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'status', ARGV[4])
  redis.call('HINCRBY', KEYS[1], 'sv', '1')
end
applyCharge(KEYS[2], usage)
appendEvent(KEYS[3], KEYS[4], KEYS[5], KEYS[1], ARGV[5], ARGV[8], ARGV[6], ARGV[7], ARGV[12], ARGV[9], ARGV[10], ARGV[11])
recordIdem(KEYS[6], ARGV[16], ARGV[17])
return {'ok'}
`)

// writeStatusScript writes the status if the status version is unchanged, and then increases
// it. The generation is not compared: a worker's status may follow a spec the user has changed
// since, and the status's observedGeneration says which generation it realised.
//
// KEYS[1] instance, KEYS[2] events, KEYS[3] event bytes, KEYS[4] history index
// ARGV[1] expected status version, ARGV[2] status JSON, ARGV[3] id, ARGV[4] event kind,
// ARGV[5] changed fields (comma-separated), ARGV[6] now (Unix ms), ARGV[7] event message
// Returns 1 when written (the event appended), 0 when the status version moved on, -1 when
// the instance is gone.
var writeStatusScript = redis.NewScript(eventLua + `
local sv = redis.call('HGET', KEYS[1], 'sv')
if not sv then
  return -1
end
if sv ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'status', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'sv', '1')
appendEvent(KEYS[2], KEYS[3], KEYS[4], KEYS[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
return 1
`)

// forgetScript is the last stage of deprovisioning, run once the backing server is gone: if
// the generation is unchanged it releases the instance's charge, frees its name claim (only
// while the claim still holds the instance's id), deletes the instance and removes it from
// both indexes, all or nothing. A forgotten instance is gone, so a second run changes nothing
// and the charge is never released twice. Its history index stays, and the instance is
// remembered among the organization's deleted ones with its project, so that those who could
// read it can still read its history; past deletedKept deleted instances, the oldest one's
// history index goes.
//
// KEYS[1] instance, KEYS[2] claim, KEYS[3] org index, KEYS[4] project index, KEYS[5] quota,
// KEYS[6] events, KEYS[7] event bytes, KEYS[8] history index, KEYS[9] deleted instances'
// projects (hash), KEYS[10] deleted instances in order (sorted set)
// ARGV[1] expected generation, ARGV[2] id, ARGV[3] now (Unix ms),
// ARGV[4..] the charge to release (negative amounts)
// Returns 1 when forgotten (a DELETED event appended, carrying the instance as it was), 0
// when the instance is gone or its generation moved on.
var forgetScript = redis.NewScript(quotaLua + eventLua + `
local gen = redis.call('HGET', KEYS[1], 'gen')
if gen ~= ARGV[1] then
  return 0
end
-- Read before anything is written, so that an error reading leaves nothing half done. A
-- release has no positive amount: it is never refused.
local _, usage = readCharge(KEYS[5], 4)
appendEvent(KEYS[6], KEYS[7], KEYS[8], KEYS[1], ARGV[2], 'DELETED', '', ARGV[3], '')
applyCharge(KEYS[5], usage)
if redis.call('GET', KEYS[2]) == ARGV[2] then
  redis.call('DEL', KEYS[2])
end
redis.call('HSET', KEYS[9], ARGV[2], redis.call('HGET', KEYS[1], 'proj'))
redis.call('ZADD', KEYS[10], ARGV[3], ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
-- The history index of an instance is its key with ':hi' appended (':h' before it was a
-- sorted set); the oldest deleted ones' are in the same slot (the organization's hash tag).
local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[2])
local excess = redis.call('ZCARD', KEYS[10]) - ` + strconv.Itoa(deletedKept) + `
if excess > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[10], excess)
  for i = 1, #popped, 2 do
    redis.call('DEL', prefix .. popped[i] .. ':hi', prefix .. popped[i] .. ':h')
    redis.call('HDEL', KEYS[9], popped[i])
  end
end
return 1
`)

// noteScript records an event on an instance's history without changing the instance: a
// warning (e.g. that duplicate servers were found and deleted), or a verb that changed no
// desired state (a reboot, a console session).
//
// KEYS[1] instance, KEYS[2] events, KEYS[3] event bytes, KEYS[4] history index, KEYS[5]
// idempotency key
// ARGV[1] id, ARGV[2] now (Unix ms), ARGV[3] kind, ARGV[4] message, ARGV[5] actor,
// ARGV[6] action, ARGV[7] outcome, ARGV[8] what the idempotency key records ("" for none),
// ARGV[9] its time to live in seconds
// Returns {"ok"}, {"gone"} when the instance is gone (nothing is recorded), or {"replay",
// value} when the idempotency key records a write already.
var noteScript = redis.NewScript(eventLua + idemLua + `
local prior = priorIdem(KEYS[5], ARGV[8])
if prior then
  return {'replay', prior}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'gone'}
end
appendEvent(KEYS[2], KEYS[3], KEYS[4], KEYS[1], ARGV[1], ARGV[3], '', ARGV[2], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
recordIdem(KEYS[5], ARGV[8], ARGV[9])
return {'ok'}
`)

// setLimitsScript sets quota limits and records their idempotency key.
//
// KEYS[1] quota, KEYS[2] idempotency key
// ARGV[1] what the idempotency key records ("" for none), ARGV[2] its time to live in seconds,
// ARGV[3..] field and limit pairs
// Returns {"ok"}, or {"replay", value} when the key records a write already.
var setLimitsScript = redis.NewScript(idemLua + `
local prior = priorIdem(KEYS[2], ARGV[1])
if prior then
  return {'replay', prior}
end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
recordIdem(KEYS[2], ARGV[1], ARGV[2])
return {'ok'}
`)

// recordKeyScript records an idempotency key alone, for a change made outside the store (an
// image the region deleted).
//
// KEYS[1] idempotency key
// ARGV[1] what the key records, ARGV[2] its time to live in seconds
// Returns {"ok"}, or {"replay", value} when the key records a write already.
var recordKeyScript = redis.NewScript(idemLua + `
local prior = priorIdem(KEYS[1], ARGV[1])
if prior then
  return {'replay', prior}
end
recordIdem(KEYS[1], ARGV[1], ARGV[2])
return {'ok'}
`)

// historyScript reads a page of one instance's history: its index from the position after
// which to start (or from the oldest event the log still keeps), then each event by its id.
// Its work is the page's, however long the organization's log is. An instance made before
// the index was a sorted set may still have its stream: its entries are read too.
//
// KEYS[1] events, KEYS[2] history index, KEYS[3] the history index as a stream (declared,
// though it rarely exists, so that a Redis Cluster whose slot migrates redirects the read
// rather than failing it)
// ARGV[1] the position to start after ("" for the oldest kept), ARGV[2] the page size
// Returns {"expired"} when the log no longer reaches back to ARGV[1], else {more (0 or 1),
// the events as XRANGE gives them...}. An event trimmed since its index entry was read is
// left out.
var historyScript = redis.NewScript(historyLua + `
local function before(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, aseq, bms, bseq = tonumber(ams), tonumber(aseq), tonumber(bms), tonumber(bseq)
  return ams < bms or (ams == bms and aseq < bseq)
end
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if #first == 0 then
  return {0}
end
local from, streamFrom = '[' .. historyMember(first[1][1]), first[1][1]
if ARGV[1] ~= '' then
  if before(ARGV[1], first[1][1]) then
    return {'expired'}
  end
  from, streamFrom = '(' .. historyMember(ARGV[1]), '(' .. ARGV[1]
end
local limit = tonumber(ARGV[2])
local ids = {}
for i, m in ipairs(redis.call('ZRANGEBYLEX', KEYS[2], from, '+', 'LIMIT', '0', tostring(limit + 1))) do
  ids[i] = historyID(m)
end
local legacy = redis.call('XRANGE', KEYS[3], streamFrom, '+', 'COUNT', tostring(limit + 1))
if #legacy > 0 then
  for _, e in ipairs(legacy) do
    ids[#ids + 1] = e[1]
  end
  table.sort(ids, before)
end
local out = {0}
for i, id in ipairs(ids) do
  if i > limit then
    out[1] = 1
    break
  end
  local ev = redis.call('XRANGE', KEYS[1], id, id)
  if #ev == 1 then
    table.insert(out, ev[1])
  end
end
return out
`)

var scripts = []*redis.Script{createScript, updateSpecScript, writeStatusScript, forgetScript, noteScript, upgradeScript, historyScript}

// upgradeScript writes a migrated instance record if it is still the one that was read: same
// version (ARGV[1], "" for none), generation and status version. Otherwise it writes nothing
// and returns 0, and the caller reads the record again.
//
// KEYS[1] instance
// ARGV[1] version read, ARGV[2] gen read, ARGV[3] sv read, ARGV[4] new version, ARGV[5] spec,
// ARGV[6] status, ARGV[7..9] description, tags and user data
var upgradeScript = redis.NewScript(`
local f = redis.call('HMGET', KEYS[1], 'v', 'gen', 'sv')
if (f[1] or '') ~= ARGV[1] or f[2] ~= ARGV[2] or f[3] ~= ARGV[3] then
  return 0
end
redis.call('HSET', KEYS[1], 'v', ARGV[4], 'spec', ARGV[5], 'status', ARGV[6], 'description', ARGV[7], 'tags', ARGV[8],
  'userData', ARGV[9])
return 1
`)
