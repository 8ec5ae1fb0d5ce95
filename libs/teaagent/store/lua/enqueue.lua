-- enqueue: append one entry to a work queue, creating its consumer group on first use.
--
-- KEYS[1] stream      STREAM  the queue
-- ARGV[1] group       the consumer group's name
-- ARGV[2] ttl_ms      the entry's expiry plus retention, from now; the stream's TTL only grows
-- ARGV[3] max_length  refuse (return "") when the queue already holds this many entries
-- ARGV[4...]          the entry's field/value pairs
--
-- Returns the new entry id, or "" when the queue is full (trimming would drop undelivered entries).
local stream, group = KEYS[1], ARGV[1]
local ttl_ms, max_length = tonumber(ARGV[2]), tonumber(ARGV[3])

if redis.call('XLEN', stream) >= max_length then
  return ''
end
local id = redis.call('XADD', stream, '*', unpack(ARGV, 4))
-- The group may exist already (BUSYGROUP); its start id 0 hands every entry to it either way.
redis.pcall('XGROUP', 'CREATE', stream, group, '0')
redis.call('PEXPIRE', stream, ttl_ms, 'NX')
redis.call('PEXPIRE', stream, ttl_ms, 'GT')
return id
