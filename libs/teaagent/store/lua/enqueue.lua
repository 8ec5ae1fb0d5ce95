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

-- -2: no stream yet (XADD makes it, and it needs the group); -1: one without a TTL.
local ttl = redis.call('PTTL', stream)
if ttl ~= -2 and redis.call('XLEN', stream) >= max_length then
  return ''
end
local id = redis.call('XADD', stream, '*', unpack(ARGV, 4))
if ttl == -2 then
  -- Made by this XADD: the group, whose start id 0 hands it this entry. A stream that exists has
  -- its group, made with it (here or by promote_due); pcall all the same (BUSYGROUP is fine).
  redis.pcall('XGROUP', 'CREATE', stream, group, '0')
end
if ttl < ttl_ms then  -- the TTL only grows; a stream without one is given one
  redis.call('PEXPIRE', stream, ttl_ms)
end
return id
