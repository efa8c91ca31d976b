package queue

import "github.com/redis/go-redis/v9"

// enqueueLua is shared by the scripts that add a key. With KEYS[1] the stream and KEYS[2]
// the state hash, enqueue(key, ...) appends a message only for an idle key: a key already
// waiting is left alone, and a key being handled is marked to run once more when its handler
// ends. The optional field/value pairs after the key (the adder's trace context) are stored
// with the message; a message without them is as valid.
const enqueueLua = `
local function enqueue(key, ...)
  local st = redis.call('HGET', KEYS[2], key)
  if not st then
    redis.call('XADD', KEYS[1], '*', 'k', key, ...)
    redis.call('HSET', KEYS[2], key, 'q')
    return 'queued'
  elseif st == 'a' then
    redis.call('HSET', KEYS[2], key, 'd')
    return 'again'
  end
  return 'coalesced'
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

// buryLua moves a key to the dead-letter stream, with KEYS[1] the stream, KEYS[2] state,
// KEYS[3] attempts, KEYS[5] dead, KEYS[6] last error: the message is acknowledged and
// deleted and the key forgotten, so it starts afresh if it is ever added again.
const buryLua = `
local function bury(group, id, key, reason, attempts, now, cap)
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', cap, '*', 'k', key, 'reason', reason, 'attempts', attempts, 'at', now)
  redis.call('XACK', KEYS[1], group, id)
  redis.call('XDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[2], key)
  redis.call('HDEL', KEYS[3], key)
  redis.call('HDEL', KEYS[6], key)
end
`

// enqueueScript adds a key now.
//
// KEYS[1] stream, KEYS[2] state, KEYS[3] delayed
// ARGV[1] key, ARGV[2…] optional field/value pairs stored with a new message
// Returns "queued", "again" or "coalesced". A delayed run of the key is dropped: it would
// only repeat the run this one asks for.
var enqueueScript = redis.NewScript(enqueueLua + `
redis.call('ZREM', KEYS[3], ARGV[1])
return enqueue(ARGV[1], unpack(ARGV, 2))
`)

// enqueueAfterScript schedules a key, keeping an earlier schedule if there is one.
//
// KEYS[1] delayed
// ARGV[1] key, ARGV[2] when (Unix ms)
var enqueueAfterScript = redis.NewScript(`
redis.call('ZADD', KEYS[1], 'LT', ARGV[2], ARGV[1])
return 1
`)

// forwardScript adds the keys whose time has come.
//
// KEYS[1] stream, KEYS[2] state, KEYS[3] delayed
// ARGV[1] now (Unix ms), ARGV[2] most keys to move
// Returns how many keys were due.
var forwardScript = redis.NewScript(enqueueLua + `
local due = redis.call('ZRANGE', KEYS[3], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[2]))
for _, key in ipairs(due) do
  redis.call('ZREM', KEYS[3], key)
  enqueue(key)
end
return #due
`)

// beginScript starts handling a delivered message: it checks the consumer still owns it,
// counts the delivery, and either hands out a fencing token or, past the delivery limit,
// moves the key to the dead-letter stream.
//
// KEYS[1] stream, KEYS[2] state, KEYS[3] attempts, KEYS[4] fence, KEYS[5] dead, KEYS[6] last error
// ARGV[1] group, ARGV[2] consumer, ARGV[3] message id, ARGV[4] key, ARGV[5] max deliveries,
// ARGV[6] now (Unix ms), ARGV[7] dead-letter stream cap
// Returns {"ok", fence, attempt}, {"lost"} or {"dead", reason, attempts}.
var beginScript = redis.NewScript(ownsLua + buryLua + `
if not owns(ARGV[1], ARGV[2], ARGV[3]) then
  return {'lost'}
end
local key = ARGV[4]
local attempt = redis.call('HINCRBY', KEYS[3], key, 1)
if attempt > tonumber(ARGV[5]) then
  local reason = redis.call('HGET', KEYS[6], key) or 'its handler never finished (the worker died or timed out)'
  bury(ARGV[1], ARGV[3], key, reason, attempt - 1, ARGV[6], ARGV[7])
  return {'dead', reason, attempt - 1}
end
redis.call('HSET', KEYS[2], key, 'a')
return {'ok', redis.call('INCR', KEYS[4]), attempt}
`)

// finishScript ends a handler run: it acknowledges and deletes the message (so the stream
// holds only entries still waiting or pending), records the outcome, and adds the key again
// if it was added while being handled, or schedules it.
//
// KEYS[1] stream, KEYS[2] state, KEYS[3] attempts, KEYS[4] delayed, KEYS[5] last error
// ARGV[1] group, ARGV[2] consumer, ARGV[3] message id, ARGV[4] key,
// ARGV[5] "ok" (attempts reset) or "failed" (error kept), ARGV[6] error message,
// ARGV[7] when to run again (Unix ms; 0 for not at all)
// Returns "ok", or "lost" when another consumer owns the message now (nothing is changed).
var finishScript = redis.NewScript(enqueueLua + ownsLua + `
if not owns(ARGV[1], ARGV[2], ARGV[3]) then
  return 'lost'
end
local key = ARGV[4]
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
if ARGV[5] == 'ok' then
  redis.call('HDEL', KEYS[3], key)
  redis.call('HDEL', KEYS[5], key)
else
  redis.call('HSET', KEYS[5], key, ARGV[6])
end
local again = redis.call('HGET', KEYS[2], key) == 'd'
redis.call('HDEL', KEYS[2], key)
if again then
  enqueue(key)
elseif ARGV[7] ~= '0' then
  redis.call('ZADD', KEYS[4], 'LT', ARGV[7], key)
end
return 'ok'
`)

// buryScript dead-letters a key whose handler gave up on it (a terminal error).
//
// KEYS[1] stream, KEYS[2] state, KEYS[3] attempts, KEYS[4] unused, KEYS[5] dead, KEYS[6] last error
// ARGV[1] group, ARGV[2] consumer, ARGV[3] message id, ARGV[4] key, ARGV[5] reason,
// ARGV[6] attempts, ARGV[7] now (Unix ms), ARGV[8] dead-letter stream cap
// Returns "ok", or "lost" when another consumer owns the message now.
var buryScript = redis.NewScript(ownsLua + buryLua + `
if not owns(ARGV[1], ARGV[2], ARGV[3]) then
  return 'lost'
end
bury(ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
return 'ok'
`)

// renewScript extends a handler's lease by resetting its message's idle time, only while the
// consumer still owns it: claiming unconditionally would steal it back from a reclaimer.
//
// KEYS[1] stream
// ARGV[1] group, ARGV[2] consumer, ARGV[3] message id
// Returns 1 when renewed, 0 when the lease is lost.
var renewScript = redis.NewScript(ownsLua + `
if not owns(ARGV[1], ARGV[2], ARGV[3]) then
  return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 1
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
// KEYS[1] stream, KEYS[2] state, KEYS[3] dead
// ARGV[1] dead-letter id
// Returns the key, or false when there is no such dead letter.
var requeueDeadScript = redis.NewScript(enqueueLua + `
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
enqueue(key)
return key
`)

// handBackScript returns messages a stopping consumer read but never began to the stream as
// new entries, with the same fields, so that another consumer's next read takes them at once
// instead of waiting a lease to reclaim them. Their keys stay waiting ("q") throughout. A
// message the consumer no longer owns, or whose entry was trimmed, is left alone.
//
// KEYS[1] stream
// ARGV[1] group, ARGV[2] consumer, ARGV[3…] message ids
// Returns how many were handed back.
var handBackScript = redis.NewScript(ownsLua + `
local n = 0
for i = 3, #ARGV do
  if owns(ARGV[1], ARGV[2], ARGV[i]) then
    local e = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])
    if #e == 1 then
      redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
      redis.call('XDEL', KEYS[1], ARGV[i])
      redis.call('XADD', KEYS[1], '*', unpack(e[1][2]))
      n = n + 1
    end
  end
end
return n
`)

var scripts = []*redis.Script{
	enqueueScript, enqueueAfterScript, forwardScript, beginScript, finishScript, buryScript,
	renewScript, pruneConsumersScript, requeueDeadScript, handBackScript,
}
