-- retry_later: take a failed entry off the queue and either schedule its next attempt or dead-letter
-- it, in one step, so a crash leaves it either pending (reclaimed later) or scheduled, never lost.
--
-- KEYS[1] stream      STREAM  the queue
-- KEYS[2] schedule    ZSET    JSON-encoded entries scored by their not-before time (ms)
-- KEYS[3] dead        STREAM  dead letters
-- ARGV[1] group       the consumer group's name
-- ARGV[2] entry_id    the failed entry
-- ARGV[3] action      "retry" or "dead"
-- ARGV[4] not_before  milliseconds; for "retry"
-- ARGV[5] error       why the attempt failed, one sentence
-- ARGV[6] ttl_ms      the entry's expiry plus retention, from now; TTLs only grow
-- ARGV[7] max_dead    bound on the dead-letter stream
-- ARGV[8] now_ms      the caller's clock, milliseconds
--
-- Returns the action taken, or "gone" when the entry was no longer pending (another consumer
-- finished it); "gone" changes nothing.
local stream, schedule, dead = KEYS[1], KEYS[2], KEYS[3]
local group, entry_id, action = ARGV[1], ARGV[2], ARGV[3]
local not_before, err = tonumber(ARGV[4]), ARGV[5]
local ttl_ms, max_dead, now_ms = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]

local found = redis.call('XRANGE', stream, entry_id, entry_id)
local acked = redis.call('XACK', stream, group, entry_id)
if #found == 0 or acked == 0 then
  return 'gone'
end
redis.call('XDEL', stream, entry_id)

local fields = found[1][2]
local out = {}
local attempts = 0
for i = 1, #fields, 2 do
  local name = fields[i]
  if name == 'attempts' then
    attempts = tonumber(fields[i + 1])
  elseif name ~= 'last_error' and name ~= 'dead_at' and name ~= 'entry_id' then
    out[#out + 1] = name
    out[#out + 1] = fields[i + 1]
  end
end
out[#out + 1] = 'attempts'
out[#out + 1] = tostring(attempts + 1)
out[#out + 1] = 'last_error'
out[#out + 1] = err

if action == 'retry' then
  -- JSON [original_id, field, value, ...]: the id keeps two retries of identical fields apart in the set,
  -- and the fields are UTF-8 text (enqueue refuses anything else), which JSON carries losslessly.
  table.insert(out, 1, entry_id)
  redis.call('ZADD', schedule, not_before, cjson.encode(out))
  if redis.call('PTTL', schedule) < ttl_ms then  -- the TTL only grows (-1: it had none)
    redis.call('PEXPIRE', schedule, ttl_ms)
  end
  return 'retry'
end
out[#out + 1] = 'entry_id'
out[#out + 1] = entry_id
out[#out + 1] = 'dead_at'
out[#out + 1] = now_ms
redis.call('XADD', dead, 'MAXLEN', '~', max_dead, '*', unpack(out))
if redis.call('PTTL', dead) < ttl_ms then  -- the TTL only grows (-1: it had none)
  redis.call('PEXPIRE', dead, ttl_ms)
end
return 'dead'
