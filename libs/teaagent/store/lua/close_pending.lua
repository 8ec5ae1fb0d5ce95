-- close_pending: make a pending request final on its origin's verified word, exactly once.
--
-- The part withdraw and settle_elsewhere both end with (teaagent.store._scripts composes them).
-- The caller has verified the evidence (PROTOCOL.md, Withdrawal; docs/protocol.md, Settlement).
-- A pending request becomes final_state, final as approved, denied and expired are: record_decision
-- counts nothing on it afterwards, and nothing settles it otherwise; the evidence is kept in its
-- field. A request already past its expiry is settled expired instead (as record_decision would
-- settle it), so a late word never hides an expiry. Any other state is left as it is.
--
-- KEYS[1] outcome      HASH    counting parameters and state (written by accept_request)
-- KEYS[2] events       STREAM  the request's events; an outcome event wakes its waiters
-- ARGV[1] evidence     the verified evidence's bytes, kept verbatim
-- ARGV[2] now          Unix seconds on the caller's clock
-- ARGV[3] max_events   bound on the events stream
-- ARGV[4] field        the outcome field that keeps the evidence (withdrawal, settlement)
-- ARGV[5] final_state  the state it closes a pending request in (withdrawn, settled)
--
-- Returns {state, changed}: final_state with changed 1 when this call closed it; "expired" with
-- changed 1 when it settled an expiry due; the state it had, changed 0, when it was not pending;
-- "unknown" when no request is stored.
local outcome_key, events_key = KEYS[1], KEYS[2]
local evidence, now, max_events = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local field, final_state = ARGV[4], ARGV[5]

local fields = redis.call('HMGET', outcome_key, 'state', 'expires_at', 'approvals', 'denials')
local state = fields[1]
if not state then
  return {'unknown', 0}
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
redis.call('HSET', outcome_key, field, evidence)
settle(final_state)
return {final_state, 1}
