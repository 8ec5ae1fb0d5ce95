-- charge_once: one rate-limit charge per request, however often its delivery comes (a cluster's receive).
--
-- On a Redis Cluster a relay takes a peer's request in steps (hold, charge, store, queue, mark),
-- one call each: a step that fails after the charge (a master restarting) makes the origin deliver
-- again, and that repeat must not be charged again. The first allowed charge leaves a mark under
-- the request's ref, in the window's slot, until the request expires; a repeat finds it and is
-- answered what the first charge was, charging nothing. A refused charge leaves no mark (it
-- charged nothing). ratelimit is defined above this text (teaagent.store._scripts).
--
-- KEYS[1] window     STRING  the origin's GCRA bucket                   (ratelimit's KEYS[1])
-- KEYS[2] charged    STRING  the mark: the remaining calls the first charge answered
-- ARGV[1..3]         ratelimit's ARGV (interval, capacity, now)
-- ARGV[4] ttl_ms     the mark's TTL in milliseconds: until the request expires
--
-- Returns ratelimit's reply: remaining >= 0 when allowed (by this call, or by the first charge of
-- this request), or -retry_after (microseconds) when refused.
local charged = redis.call('GET', KEYS[2])
if charged then
  return tonumber(charged)
end
local remaining = ratelimit({KEYS[1]}, {ARGV[1], ARGV[2], ARGV[3]})
if remaining >= 0 then
  redis.call('SET', KEYS[2], remaining, 'PX', ARGV[4])
end
return remaining
