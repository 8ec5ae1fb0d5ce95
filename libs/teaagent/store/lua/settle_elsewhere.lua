-- settle_elsewhere: mark a received request settled at its origin, on verified evidence, exactly once.
--
-- The caller has verified the evidence (docs/protocol.md, Settlement): the origin's quorum
-- certificate, or the signed denials that made the request fail. A pending item becomes
-- "settled", a final state as withdrawn is: record_decision counts nothing on it afterwards. An
-- item this node decided first keeps its decision and gains the evidence; a withdrawn or expired
-- one, or one already settled, is left as it is. A pending item past its expiry is settled
-- expired instead (as record_decision would settle it).
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
local outcome_key, events_key = KEYS[1], KEYS[2]
local settlement, now, max_events = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local fields = redis.call('HMGET', outcome_key, 'state', 'expires_at', 'approvals', 'denials', 'settlement')
local state = fields[1]
if not state then
  return {'unknown', 0}
end
if fields[5] then
  return {state, 0}
end
if state == 'approved' or state == 'denied' then
  redis.call('HSET', outcome_key, 'settlement', settlement)
  return {state, 1}
end
if state ~= 'pending' then
  return {state, 0}
end

local function settle(new_state)
  redis.call('HSET', outcome_key, 'state', new_state, 'decided_at', now)
  redis.call('XADD', events_key, 'MAXLEN', '~', max_events, '*',
    'type', 'outcome', 'state', new_state, 'approvals', fields[3], 'denials', fields[4], 'at', now)
end

if now > tonumber(fields[2]) then
  settle('expired')
  return {'expired', 1}
end
redis.call('HSET', outcome_key, 'settlement', settlement)
settle('settled')
return {'settled', 1}
