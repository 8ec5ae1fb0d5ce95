-- ratelimit: one check of a sliding window, in one round trip.
--
-- The window is a log of the calls it counted (a sorted set scored by time), so "max_calls per
-- window" holds exactly over every window, not only over fixed buckets; a refused call is not logged.
--
-- KEYS[1] window     ZSET    one member per counted call, scored by its time in milliseconds
-- ARGV[1] window_ms  the window's length, milliseconds
-- ARGV[2] max_calls  calls allowed per window
-- ARGV[3] now_ms     the caller's clock, milliseconds (tests pass time explicitly)
-- ARGV[4] member     a unique name for this call
--
-- The two constant arguments come first, so a caller can keep everything before now_ms encoded.
-- Returns one integer (a table reply costs the server more than the whole ZCARD): remaining >= 0
-- when the call is allowed and counted, or -retry_after_ms (<= -1) when it is refused.
-- The key lives exactly one window after its newest call.
local key = KEYS[1]
local window, max_calls, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

-- A call logged exactly one window ago has left the window.
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local count = redis.call('ZCARD', key)
if count < max_calls then
  -- The arguments go on as the strings they came in: a number would be formatted back into one.
  redis.call('ZADD', key, ARGV[3], ARGV[4])
  -- Every counted call moves the expiry: the TTL must cover the newest member, not the first.
  redis.call('PEXPIRE', key, ARGV[1])
  return max_calls - count - 1
end
-- The window frees up once enough of its oldest calls have left it; it can hold more than max_calls
-- calls when the limit was lowered since they were counted.
local freeing = redis.call('ZRANGE', key, count - max_calls, count - max_calls, 'WITHSCORES')
local retry_after = tonumber(freeing[2]) + window - now
if retry_after < 1 then
  retry_after = 1
elseif retry_after > window then
  -- A clock ahead of ours logged the oldest call; never ask for more than one window.
  retry_after = window
end
return -retry_after
