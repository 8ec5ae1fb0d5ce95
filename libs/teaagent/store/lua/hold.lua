-- hold: count a peer's new request against what its origin may hold pending in this inbox.
--
-- One sorted set per origin holds the refs of its pending requests, scored by expires_at. A ref
-- leaves it when its request is decided or withdrawn (the store removes it in or after the
-- settling script, as it removes the ref from the pending set), and when the request expires:
-- the refs of expired requests are trimmed here first, so an expiry frees room even if nobody
-- settles it.
--
-- KEYS[1] held        ZSET    the origin's pending refs, by expires_at
-- ARGV[1] member      the request's ref, <origin>/<request_id>
-- ARGV[2] expires_at  Unix seconds, its score
-- ARGV[3] now         Unix seconds on the caller's clock; refs scored below it are expired
-- ARGV[4] cap         how many pending requests the origin may hold
-- ARGV[5] ttl_ms      the set's TTL in milliseconds: until this ref expires (it only grows)
--
-- Returns the number of refs held once this one is (a ref held already, by a retry after a
-- crash, is counted once), or minus the number held when the origin already holds cap of them:
-- then only the trim is written.
local held_key, member = KEYS[1], ARGV[1]

redis.call('ZREMRANGEBYSCORE', held_key, '-inf', '(' .. ARGV[3])
local held = redis.call('ZCARD', held_key)
if redis.call('ZSCORE', held_key, member) then
  return held
end
if held >= tonumber(ARGV[4]) then
  return -held
end
redis.call('ZADD', held_key, ARGV[2], member)
-- The TTL only grows: a set made by this ZADD (none held: no key) is given one, else a longer one.
local ttl_ms = tonumber(ARGV[5])
if held == 0 or redis.call('PTTL', held_key) < ttl_ms then
  redis.call('PEXPIRE', held_key, ttl_ms)
end
return held + 1
