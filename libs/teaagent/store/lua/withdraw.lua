-- withdraw: mark a pending request withdrawn by its origin, a final state, exactly once.
--
-- The caller has verified the origin's signed withdrawal (PROTOCOL.md, Withdrawal). Withdrawn is
-- final as approved, denied and expired are: record_decision counts nothing on it afterwards, and
-- nothing settles it otherwise. A request already past its expiry is settled expired instead (as
-- record_decision would settle it), so a late withdrawal never hides an expiry.
--
-- KEYS[1] outcome     HASH    counting parameters and state (written by accept_request)
-- KEYS[2] events      STREAM  the request's events; an outcome event wakes its waiters
-- ARGV[1] withdrawal  the verified withdrawal's bytes, kept verbatim
-- ARGV[2] now         Unix seconds on the caller's clock
-- ARGV[3] max_events  bound on the events stream
--
-- Returns {state, changed}: state "withdrawn" with changed 1 when this call withdrew it, 0 for a
-- repeat; another final state (approved, denied, expired) with changed 0 when it was settled
-- before (or is settled expired here: changed 1); state "unknown" when no request is stored.
local outcome_key, events_key = KEYS[1], KEYS[2]
local withdrawal, now, max_events = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

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
redis.call('HSET', outcome_key, 'withdrawal', withdrawal)
settle('withdrawn')
return {'withdrawn', 1}
