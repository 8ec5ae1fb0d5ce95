-- record_delivery: note how the delivery of one of this node's own requests to one peer went.
--
-- For display only (who received the request, who could not be reached): counting never reads it.
-- "delivered" is final: a later attempt of a repeated delivery (the agent sent the request again)
-- never turns it back into "failing". "pending" (queued) is written only while nothing else is
-- known, so queueing it again never hides what an attempt found.
--
-- KEYS[1] outcome     HASH    the request's counting state (written by accept_request)
-- KEYS[2] deliveries  HASH    peer -> JSON {state, attempts, error, at}
-- ARGV[1] peer        the peer's agent id
-- ARGV[2] state       pending | delivered | failing | given_up
-- ARGV[3] record      the JSON value to store
--
-- Returns 1 when written, 0 when not (no such request: nothing is written, so no key lacks a TTL;
-- or the state kept above).
local outcome_key, deliveries_key = KEYS[1], KEYS[2]
local peer, state, record = ARGV[1], ARGV[2], ARGV[3]

local ttl = redis.call('PTTL', outcome_key)
if ttl == -2 then
  return 0
end
local current = redis.call('HGET', deliveries_key, peer)
if current then
  if state == 'pending' then
    return 0
  end
  local ok, old = pcall(cjson.decode, current)
  if ok and type(old) == 'table' and old['state'] == 'delivered' then
    return 0
  end
end
redis.call('HSET', deliveries_key, peer, record)
if ttl > 0 then
  redis.call('PEXPIRE', deliveries_key, ttl)
end
return 1
