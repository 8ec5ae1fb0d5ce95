-- ratelimit: one GCRA check, in one round trip (teaagent.tools.gcra_step is the same arithmetic).
--
-- A limit of max_calls per window is a bucket of max_calls calls refilled one call per interval
-- (window / max_calls). The key holds one number, the theoretical arrival time (TAT): when the
-- bucket would be full again. No key is a full bucket. A refused call changes nothing.
--
-- KEYS[1] window     STRING  the TAT, whole microseconds on the callers' clock
-- ARGV[1] interval   one refill, microseconds (at least 1)
-- ARGV[2] capacity   max_calls refills, microseconds: the furthest the TAT may run ahead of now
-- ARGV[3] now        the caller's clock, microseconds (tests pass time explicitly)
--
-- The two constant arguments come first, so a caller can keep everything before now encoded.
-- Returns one integer (a table reply costs the server more than the arithmetic): remaining >= 0
-- when the call is allowed and counted, or -retry_after (<= -1, microseconds) when it is refused.
-- The key expires when its bucket is full again.
--
-- This runs once per rate-limited call, so it stays lean: two redis.call (each costs more than all
-- the arithmetic), strings turned to numbers by "+ 0", and floor division written as x - x % y.
-- Microsecond times (about 1.8e15) are exact in Lua's doubles, and redis.call writes such a
-- number as its integer digits.
local now = ARGV[3] + 0
local tat = redis.call('GET', KEYS[1])  -- false when the key is missing
if tat then
  tat = tat + 0
  if tat < now then
    tat = now
  end
else
  tat = now
end
local interval, capacity = ARGV[1] + 0, ARGV[2] + 0
local ahead = tat + interval - now
if ahead > capacity then
  -- A TAT more than a full bucket ahead was set by a clock ahead of ours: never ask for more.
  local wait = ahead - capacity
  if wait > capacity then
    return -capacity
  end
  return -wait
end
local ttl = ahead + 999  -- milliseconds, rounded up
redis.call('SET', KEYS[1], tat + interval, 'PX', (ttl - ttl % 1000) / 1000)
local room = capacity - ahead
return (room - room % interval) / interval
