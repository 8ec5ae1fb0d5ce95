-- settle_elsewhere: mark a received request settled at its origin, on verified evidence, exactly once.
--
-- The caller has verified the evidence (docs/protocol.md, Settlement): the origin's quorum
-- certificate, or the signed denials that made the request fail. A pending item becomes
-- "settled", a final state as withdrawn is: record_decision counts nothing on it afterwards. An
-- item this node decided first keeps its decision and gains the evidence; a withdrawn or expired
-- one, or one already settled, is left as it is. A pending item past its expiry is settled
-- expired instead (as record_decision would settle it). The pending item is close_pending's,
-- defined above this text (teaagent.store._scripts).
--
-- KEYS[1] outcome     HASH    counting parameters and state (written by accept_request)
-- KEYS[2] events      STREAM  the request's events; an outcome event wakes its waiters
-- ARGV[1] settlement  the verified evidence's bytes, kept verbatim
-- ARGV[2] now         Unix seconds on the caller's clock
-- ARGV[3] max_events  bound on the events stream
--
-- Returns {state, changed}: state "settled" with changed 1 when this call settled it; the state it
-- had otherwise, changed 1 only when the evidence was added to this node's decision (or when it
-- is settled expired here); state "unknown" when no request is stored.
local outcome_key, settlement = KEYS[1], ARGV[1]

local fields = redis.call('HMGET', outcome_key, 'state', 'settlement')
local state = fields[1]
if state and fields[2] then
  return {state, 0}
end
if state == 'approved' or state == 'denied' then
  redis.call('HSET', outcome_key, 'settlement', settlement)
  return {state, 1}
end
return close_pending(KEYS, {settlement, ARGV[2], ARGV[3], 'settlement', 'settled'})
