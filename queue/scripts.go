package queue

import "github.com/redis/go-redis/v9"

// EnqueueLua is shared by the scripts that add a key, the queue's own and those of other
// packages that add one in the script that writes what the key's work is for (Addition).
// enqueue(stream, state, delayed, key, ...) appends a message only for an idle key: a key already waiting is left alone, and a key being
// handled (its state starts with "a", byte 97) is marked to run once more when its handler
// ends. A delayed run of the key is dropped: it would only repeat the run this one asks for.
// The optional field/value pairs after the key (the adder's trace context) are stored with the
// message; a message without them is as valid.
//
// The state of a waiting key names its message ("q<id>", or "Q<id>" when the key has earlier
// failed deliveries to count), so that beginning it proves the message is still the key's one,
// unbegun; a handled key's ("a<fence>", "d<fence>") names its run, so that finishing it proves
// no later run took the key over. An idle key has no state unless it is scheduled: "s", or "f"
// with earlier failures. So a key with no state has no delayed run to drop, and the add of a
// fresh key, the common case, skips the sorted set.
const EnqueueLua = `
local function enqueue(stream, state, delayed, key, ...)
  local st = redis.call('HGET', state, key)
  if st then
    redis.call('ZREM', delayed, key)
  end
  if not st or st == 's' or st == 'f' then
    local id = redis.call('XADD', stream, '*', 'k', key, ...)
    redis.call('HSET', state, key, (st == 'f' and 'Q' or 'q') .. id)
    return 'queued'
  elseif string.byte(st) == 97 then
    redis.call('HSET', state, key, 'd' .. string.sub(st, 2))
    return 'again'
  end
  return 'coalesced'
end
`

// buryLua moves a key to the dead-letter stream: the message is acknowledged and deleted and
// the key forgotten, so it starts afresh if it is ever added again.
const buryLua = `
local function bury(stream, state, attempts, dead, lastErr, group, id, key, reason, n, now, cap)
  redis.call('XADD', dead, 'MAXLEN', '~', cap, '*', 'k', key, 'reason', reason, 'attempts', n, 'at', now)
  redis.call('XACK', stream, group, id)
  redis.call('XDEL', stream, id)
  redis.call('HDEL', state, key)
  redis.call('HDEL', attempts, key)
  redis.call('HDEL', lastErr, key)
end
`

// runsLua tells, with st a key's state, whether the run holding fence still has the key.
const runsLua = `
local function runs(st, fence)
  return st == 'a' .. fence or st == 'd' .. fence
end
`

// ownsLua checks, with KEYS[1] the stream, that the message is pending with the consumer:
// if another consumer reclaimed it, this one must no longer act on it.
const ownsLua = `
local function owns(group, consumer, id)
  local p = redis.call('XPENDING', KEYS[1], group, id, id, 1)
  return #p == 1 and p[1][2] == consumer
end
`

// enqueueScript adds keys now, of one or more shards.
//
// KEYS, per shard: stream, state, delayed
// ARGV, per shard: how many keys, then per key: the key, how many field/value items follow,
// and those (stored with a new message)
// Returns per key, in order: "queued", "again" or "coalesced".
var enqueueScript = redis.NewScript(EnqueueLua + `
local out = {}
local a = 1
for k = 0, #KEYS - 1, 3 do
  local n = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, n do
    local fields = tonumber(ARGV[a + 1])
    out[#out + 1] = enqueue(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a], unpack(ARGV, a + 2, a + 1 + fields))
    a = a + 2 + fields
  end
end
return out
`)

// enqueueOneScript adds one key now, as enqueueScript does, in a call of its own: lighter
// than a batch of one, and the common case.
//
// KEYS[1] stream, KEYS[2] state, KEYS[3] delayed
// ARGV[1] key, then field/value items (stored with a new message)
// Returns "queued", "again" or "coalesced".
var enqueueOneScript = redis.NewScript(EnqueueLua + `
return enqueue(KEYS[1], KEYS[2], KEYS[3], ARGV[1], unpack(ARGV, 2))
`)

// enqueueAfterScript schedules a key, keeping an earlier schedule if there is one. An idle
// key's state says it is scheduled (EnqueueLua); a key waiting or being handled keeps its own.
//
// KEYS[1] delayed, KEYS[2] state
// ARGV[1] key, ARGV[2] when (Unix ms)
var enqueueAfterScript = redis.NewScript(`
redis.call('ZADD', KEYS[1], 'LT', ARGV[2], ARGV[1])
redis.call('HSETNX', KEYS[2], ARGV[1], 's')
return 1
`)

// forwardScript adds the keys whose time has come.
//
// KEYS[1] stream, KEYS[2] state, KEYS[3] delayed
// ARGV[1] now (Unix ms), ARGV[2] most keys to move
// Returns how many keys were due.
var forwardScript = redis.NewScript(EnqueueLua + `
local due = redis.call('ZRANGE', KEYS[3], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then
  redis.call('ZREM', KEYS[3], unpack(due))
end
for _, key in ipairs(due) do
  enqueue(KEYS[1], KEYS[2], KEYS[3], key)
end
return #due
`)

// beginLua begins messages of one shard: for each it checks the message is still the one to
// run, counts the delivery, and either hands out a fencing token or, past the delivery limit,
// moves the key to the dead-letter stream. msgs are {id, key, reclaimed}; ARGV[1] to ARGV[5]
// are the group, the consumer, max deliveries, now (Unix ms) and the dead-letter stream cap.
//
// A message just read was delivered once, to the caller; it begins if its key's state still
// names it as waiting ("q<id>", "Q<id>"; a bare "q" is an entry written before states named
// their message). A reclaimed message begins if the caller still owns it; Redis's delivery
// count tells how often it was delivered, crashed consumers' deliveries included. A key's
// attempt is that count plus the deliveries of its earlier messages that failed (the attempts
// hash, written only when a run fails), read unless the state says there are none ("q<id>").
// The fencing tokens of every message a call began are then one INCRBY (fenceBegun) of the
// counter its first shard's keys name: the call's shards share it (fenceKey).
//
// Returns a verdict per message, in order: {"ok", fence, attempt, earlier failed deliveries},
// {"lost"} or {"dead", reason, attempts}.
const beginLua = buryLua + `
local begun = {}
local function begin(stream, state, attempts, dead, lastErr, msgs)
  local group, consumer, max = ARGV[1], ARGV[2], tonumber(ARGV[3])
  local verdicts = {}
  -- Numeric loops over messages and runs, here and in the scripts, not ipairs: each step of
  -- ipairs is a call into Lua's C library.
  for i = 1, #msgs do
    local m = msgs[i]
    local id, key = m[1], m[2]
    local st = redis.call('HGET', state, key)
    local count, fresh
    if not m[3] then
      if st == 'q' .. id then
        count, fresh = 1, true
      elseif st == 'Q' .. id or st == 'q' then
        count = 1
      end
    else
      local p = redis.call('XPENDING', stream, group, id, id, 1)
      if #p == 1 and p[1][2] == consumer then
        count = p[1][4]
      end
    end
    if not count then
      verdicts[i] = {'lost'}
    else
      local earlier = 0
      if not fresh then
        earlier = tonumber(redis.call('HGET', attempts, key) or 0)
      end
      local attempt = earlier + count
      if attempt > max then
        local reason = redis.call('HGET', lastErr, key) or 'its handler never finished (the worker died or timed out)'
        bury(stream, state, attempts, dead, lastErr, group, id, key, reason, attempt - 1, ARGV[4], ARGV[5])
        verdicts[i] = {'dead', reason, attempt - 1}
      else
        verdicts[i] = {'ok', 0, attempt, earlier}
        begun[#begun + 1] = {state, key, verdicts[i]}
      end
    end
  end
  return verdicts
end

-- fenceBegun hands out the fencing tokens of every message the call began, of every shard, with
-- one INCRBY, and records each run in its key's state.
local function fenceBegun(fence)
  if #begun == 0 then
    return
  end
  local first = redis.call('INCRBY', fence, #begun) - #begun
  for j = 1, #begun do
    local b = begun[j]
    b[3][2] = first + j
    redis.call('HSET', b[1], b[2], 'a' .. (first + j))
  end
end
`

// beginScript begins messages the caller read (a blocking read, outside any script) or
// reclaimed, of one or more shards, in one call (beginLua).
//
// KEYS, per shard: beginShardKeys, each naming the same fence counter
// ARGV[1] group, ARGV[2] consumer, ARGV[3] max deliveries, ARGV[4] now (Unix ms),
// ARGV[5] dead-letter stream cap, then per shard: how many messages, then per message: its id,
// key and "n" (read new) or "r" (reclaimed)
// Returns the verdict of each message, in order.
var beginScript = redis.NewScript(beginLua + `
local out = {}
local a = 6
for k = 0, #KEYS - 1, 6 do
  local msgs = {}
  for _ = 1, tonumber(ARGV[a]) do
    msgs[#msgs + 1] = {ARGV[a + 1], ARGV[a + 2], ARGV[a + 3] == 'r'}
    a = a + 3
  end
  a = a + 1
  local verdicts = begin(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 5], KEYS[k + 6], msgs)
  for i = 1, #verdicts do
    out[#out + 1] = verdicts[i]
  end
end
fenceBegun(KEYS[4])
return out
`)

// takeScript finishes handler runs and then reads new messages of one or more shards and
// begins them, in one call: what a consumer does while messages are waiting, instead of a
// finish, a read and a begin. It reads without blocking, never more than asked, as few shards
// at a time as it may: as many as messages are still wanted, from the given one on, until
// enough are taken or every shard was read; then more of those that had their share.
//
// KEYS, per shard: takeShardKeys, each naming the same fence counter
// ARGV[1] group, ARGV[2] consumer, ARGV[3] max deliveries, ARGV[4] now (Unix ms),
// ARGV[5] dead-letter stream cap, ARGV[6] most messages to take, ARGV[7] the shard (its place
// among the call's, from 0) to read first, then per shard: how many runs to finish, then each
// run's eight fields (finishLua)
// Returns {the verdict of each run finished, in order ("ok" or "lost"), per message taken:
// {its shard's place, id, fields, verdict (beginLua)}}.
var takeScript = redis.NewScript(beginLua + finishLua + `
local shards = #KEYS / 7
local finished = {}
local a = 8
for g = 0, shards - 1 do
  local k, n = g * 7, tonumber(ARGV[a])
  if n > 0 then
    finish(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 7], KEYS[k + 6], ARGV[1], a + 1, n, finished)
  end
  a = a + 8 * n + 1
end
local want = tonumber(ARGV[6])
local taken = {}
local function take(g, entries)
  local k = g * 7
  local msgs = {}
  for i = 1, #entries do
    local e, key = entries[i], ''
    for f = 1, #e[2], 2 do
      if e[2][f] == 'k' then key = e[2][f + 1] end
    end
    msgs[i] = {e[1], key}
  end
  local verdicts = begin(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 5], KEYS[k + 6], msgs)
  for i = 1, #entries do
    local e = entries[i]
    taken[#taken + 1] = {g, e[1], e[2], verdicts[i]}
  end
  want = want - #entries
end
-- Read without blocking, never more than wanted, in as few reads as it takes: each reads, an
-- even share apiece, as many shards (from the one to read first on) as messages are still
-- wanted, all of those left when more are wanted than remain, and the next read goes on from
-- there. Then, while more are wanted, the shards that gave their whole share, one by one.
local first, read, full = tonumber(ARGV[7]), 0, {}
while want > 0 and read < shards do
  local span = math.min(want, shards - read)
  local share = math.floor(want / span)
  local args, place = {'XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', share, 'STREAMS'}, {}
  for j = read, read + span - 1 do
    local g = (first + j) % shards
    place[KEYS[g * 7 + 1]] = g
    args[#args + 1] = KEYS[g * 7 + 1]
  end
  for _ = 1, span do
    args[#args + 1] = '>'
  end
  read = read + span
  for _, r in ipairs(redis.call(unpack(args)) or {}) do
    take(place[r[1]], r[2])
    if #r[2] == share then
      full[#full + 1] = place[r[1]]
    end
  end
end
for _, g in ipairs(full) do
  if want == 0 then
    break
  end
  local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', want, 'STREAMS', KEYS[g * 7 + 1], '>')
  if r then
    take(g, r[1][2])
  end
end
fenceBegun(KEYS[4])
return {finished, taken}
`)

// finishLua ends handler runs of one shard: it acknowledges and deletes their messages (so the
// stream holds only entries still waiting or pending), records each outcome, and adds each key
// again if it was added while being handled, or schedules it (its state then says so:
// EnqueueLua). A run whose fence no longer holds its key (a later run took it over) changes
// nothing. Its n runs are in ARGV from position a (the first field after their count), eight
// fields each: message id, key, fence, "ok" (attempts reset) or "failed" (attempt and error
// kept), earlier failed deliveries (when 0 there is nothing to reset), attempt, error message,
// when to run again (Unix ms; 0 for not at all). They are read where they are: a table of each,
// and unpacking it, cost Lua more than the run's own commands.
//
// Appends to out per run, in order: "ok", or "lost" when another run has the key now.
const finishLua = runsLua + `
local function finish(stream, state, attempts, delayed, lastErr, group, a, n, out)
  local acked, idle = {}, {}
  for r = a, a + 8 * (n - 1), 8 do
    local id, key, fence, status, earlier, attempt, err, at =
      ARGV[r], ARGV[r + 1], ARGV[r + 2], ARGV[r + 3], ARGV[r + 4], ARGV[r + 5], ARGV[r + 6], ARGV[r + 7]
    local st = redis.call('HGET', state, key)
    if not runs(st, fence) then
      out[#out + 1] = 'lost'
    else
      acked[#acked + 1] = id
      if status == 'ok' then
        if earlier ~= '0' then
          redis.call('HDEL', attempts, key)
          redis.call('HDEL', lastErr, key)
        end
      else
        redis.call('HSET', attempts, key, attempt)
        redis.call('HSET', lastErr, key, err)
      end
      if string.byte(st) == 100 then -- "d": added again while handled
        local waiting = status == 'ok' and 'q' or 'Q'
        redis.call('HSET', state, key, waiting .. redis.call('XADD', stream, '*', 'k', key))
      elseif at ~= '0' or status ~= 'ok' then
        redis.call('ZADD', delayed, 'LT', at, key)
        redis.call('HSET', state, key, status == 'ok' and 's' or 'f')
      else
        idle[#idle + 1] = key
      end
      out[#out + 1] = 'ok'
    end
  end
  if #acked > 0 then
    redis.call('XACK', stream, group, unpack(acked))
    redis.call('XDEL', stream, unpack(acked))
  end
  if #idle > 0 then
    redis.call('HDEL', state, unpack(idle))
  end
end
`

// finishScript ends handler runs, of one or more shards, in one call (finishLua).
//
// KEYS, per shard: finishShardKeys
// ARGV[1] group, then per shard: how many runs, then each run's eight fields (finishLua)
// Returns per run, in order: "ok" or "lost".
var finishScript = redis.NewScript(finishLua + `
local out = {}
local a = 2
for k = 0, #KEYS - 1, 5 do
  local n = tonumber(ARGV[a])
  finish(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5], ARGV[1], a + 1, n, out)
  a = a + 8 * n + 1
end
return out
`)

// buryScript dead-letters a key whose handler gave up on it (a terminal error).
//
// KEYS buryShardKeys
// ARGV[1] group, ARGV[2] message id, ARGV[3] key, ARGV[4] the run's fence, ARGV[5] reason,
// ARGV[6] attempts, ARGV[7] now (Unix ms), ARGV[8] dead-letter stream cap
// Returns "ok", or "lost" when another run has the key now.
var buryScript = redis.NewScript(buryLua + runsLua + `
if not runs(redis.call('HGET', KEYS[2], ARGV[3]), ARGV[4]) then
  return 'lost'
end
bury(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2], ARGV[3], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
return 'ok'
`)

// renewScript extends the leases of messages a consumer holds, of one or more shards, by
// resetting their idle time, only while the consumer still owns them: claiming
// unconditionally would steal them back from a reclaimer. JUSTID leaves the delivery counts
// alone, which count deliveries, not renewals.
//
// KEYS, per shard: stream
// ARGV[1] group, ARGV[2] consumer, then per shard: how many messages, then their ids
// Returns per message, in order: 1 when renewed, 0 when the lease is lost.
var renewScript = redis.NewScript(`
local out = {}
local a = 3
for k = 1, #KEYS do
  local claim = {KEYS[k], ARGV[1], ARGV[2], 0}
  for i = 1, tonumber(ARGV[a]) do
    local id = ARGV[a + i]
    local p = redis.call('XPENDING', KEYS[k], ARGV[1], id, id, 1)
    if #p == 1 and p[1][2] == ARGV[2] then
      claim[#claim + 1] = id
      out[#out + 1] = 1
    else
      out[#out + 1] = 0
    end
  end
  a = a + tonumber(ARGV[a]) + 1
  if #claim > 4 then
    claim[#claim + 1] = 'JUSTID'
    redis.call('XCLAIM', unpack(claim))
  end
end
return out
`)

// pruneConsumersScript removes consumers that hold no pending messages and have been idle
// longer than the limit. Deleting a consumer drops its pending entries, so the check and the
// deletion must be one atomic step.
//
// KEYS[1] stream
// ARGV[1] group, ARGV[2] idle limit (ms), ARGV[3] a consumer never to remove (the caller)
// Returns how many consumers were removed.
var pruneConsumersScript = redis.NewScript(`
local removed = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if info['name'] ~= ARGV[3] and info['pending'] == 0 and info['idle'] > tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    removed = removed + 1
  end
end
return removed
`)

// requeueDeadScript moves one dead letter back onto the work stream.
//
// KEYS[1] stream, KEYS[2] state, KEYS[3] dead, KEYS[4] delayed
// ARGV[1] dead-letter id
// Returns the key, or false when there is no such dead letter.
var requeueDeadScript = redis.NewScript(EnqueueLua + `
local e = redis.call('XRANGE', KEYS[3], ARGV[1], ARGV[1])
if #e == 0 then
  return false
end
local key
local f = e[1][2]
for i = 1, #f, 2 do
  if f[i] == 'k' then key = f[i + 1] end
end
redis.call('XDEL', KEYS[3], ARGV[1])
enqueue(KEYS[1], KEYS[2], KEYS[4], key)
return key
`)

// handBackScript returns messages a stopping consumer read but never began to the stream as
// new entries, with the same fields, so that another consumer's next read takes them at once
// instead of waiting a lease to reclaim them. Their keys stay waiting, their state naming the
// new entry. A message the consumer no longer owns, whose entry was trimmed, or whose key no
// longer waits for it, is left alone.
//
// KEYS[1] stream, KEYS[2] state
// ARGV[1] group, ARGV[2] consumer, then per message: its id and key
// Returns how many were handed back.
var handBackScript = redis.NewScript(ownsLua + `
local n = 0
for i = 3, #ARGV, 2 do
  local id, key = ARGV[i], ARGV[i + 1]
  local st = redis.call('HGET', KEYS[2], key)
  if (st == 'q' .. id or st == 'Q' .. id or st == 'q') and owns(ARGV[1], ARGV[2], id) then
    local e = redis.call('XRANGE', KEYS[1], id, id)
    if #e == 1 then
      redis.call('XACK', KEYS[1], ARGV[1], id)
      redis.call('XDEL', KEYS[1], id)
      local new = redis.call('XADD', KEYS[1], '*', unpack(e[1][2]))
      redis.call('HSET', KEYS[2], key, string.sub(st, 1, 1) .. new)
      n = n + 1
    end
  end
end
return n
`)

// raiseScript raises a counter to a value, never lowering it.
//
// KEYS[1] the counter
// ARGV[1] the value
var raiseScript = redis.NewScript(`
if tonumber(redis.call('GET', KEYS[1]) or 0) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
`)

var scripts = []*redis.Script{
	enqueueScript, enqueueOneScript, enqueueAfterScript, forwardScript, beginScript, takeScript, finishScript, buryScript,
	renewScript, pruneConsumersScript, requeueDeadScript, handBackScript,
}
