-- promote_due: move scheduled retries whose time has come back onto the queue's stream.
--
-- KEYS[1] stream      STREAM  the queue
-- KEYS[2] schedule    ZSET    JSON-encoded entries scored by their not-before time (ms)
-- ARGV[1] group       the consumer group's name
-- ARGV[2] now_ms      the caller's clock, milliseconds
-- ARGV[3] count       promote at most this many
-- ARGV[4] idle_ttl_ms TTL of a stream created empty here, so the key never lives forever
--
-- Returns {promoted, next_due_ms}: next_due_ms is the earliest remaining not-before, or -1.
local stream, schedule = KEYS[1], KEYS[2]
local group = ARGV[1]
local now_ms, count, idle_ttl_ms = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

local due = redis.call('ZRANGEBYSCORE', schedule, '-inf', now_ms, 'LIMIT', 0, count)
for _, member in ipairs(due) do
  -- retry_later encoded [original_id, field, value, ...]; the fields go back verbatim.
  local fields = cjson.decode(member)
  redis.call('XADD', stream, '*', unpack(fields, 2))
  redis.call('ZREM', schedule, member)
end
-- A consumer needs the group before it can block on the stream; MKSTREAM creates an empty stream.
-- BUSYGROUP (the usual answer: the stream and its group are there, with the TTL of whoever made
-- them) is fine. Made here, the stream is given a TTL; NX leaves a longer one set by enqueue alone.
if redis.pcall('XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM').ok then
  redis.call('PEXPIRE', stream, idle_ttl_ms, 'NX')
end
local next_due = redis.call('ZRANGE', schedule, 0, 0, 'WITHSCORES')
if #next_due == 0 then
  return {#due, -1}
end
return {#due, math.floor(tonumber(next_due[2]))}
