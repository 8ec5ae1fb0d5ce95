-- record_decision: count one already-verified decision and decide the outcome exactly once.
--
-- The caller has verified the signature and the signer's membership (rules 1 to 4); this script
-- applies the rest of PROTOCOL.md "Counting", as teaagent.quorum.Tally.step does (keep them
-- together; tests/test_quorum_parity.py holds them to each other): expired when now > expires_at
-- first; each signer counts once (rule 5); a signer that denied counts as a denial only (rule 6):
-- its approval before the denial is taken away, one after it is not counted; denied as soon as
-- denials exceed peers - required; approved when approvals reach required; once decided, the
-- outcome never changes. The events are appended here, in the same step.
--
-- KEYS[1] outcome     HASH    counting parameters and state (written by accept_request)
-- KEYS[2] decisions   HASH    "<kind>:<signer>" -> decision bytes
-- KEYS[3] events      STREAM  the request's events
-- ARGV[1] kind        "approval", "denial", or "" to only settle expiry
-- ARGV[2] signer      the verified signer's agent id
-- ARGV[3] decision    the decision's bytes, kept verbatim
-- ARGV[4] now         Unix seconds on the caller's clock
-- ARGV[5] max_events  bound on the events stream
-- ARGV[6] policy      optional: a version 2 request's policy, "all_of|2:beta,gamma|1:epsilon,zeta"
--                     (teaagent.trust.QuorumPolicy.script_form; each term "required:peer,peer...").
--                     With it the terms decide instead of required of peers, as QuorumPolicy.state
--                     does: each signer counts toward every term that holds it; all_of is approved
--                     when every term is met, any_of when one is; denied as soon as the policy can
--                     no longer be met by the signers who have not denied.
--
-- Returns {state, approvals, denials, counted, decided}: counted is 1 when this decision changed the
-- count (a signer's first approval, or its first denial, which replaces its approval), decided is 1
-- when this call settled the outcome; state "unknown" when no request is stored.
local outcome_key, decisions_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local kind, signer, decision = ARGV[1], ARGV[2], ARGV[3]
local now, max_events = tonumber(ARGV[4]), tonumber(ARGV[5])
local policy = ARGV[6] or ''

local fields = redis.call('HMGET', outcome_key, 'state', 'required', 'peers', 'expires_at', 'approvals', 'denials')
local state = fields[1]
if not state then
  return {'unknown', 0, 0, 0, 0}
end
local required, peers, expires_at = tonumber(fields[2]), tonumber(fields[3]), tonumber(fields[4])
local approvals, denials = tonumber(fields[5]), tonumber(fields[6])

local function settle(new_state)
  redis.call('HSET', outcome_key, 'state', new_state, 'decided_at', now)
  redis.call('XADD', events_key, 'MAXLEN', '~', max_events, '*',
    'type', 'outcome', 'state', new_state, 'approvals', approvals, 'denials', denials, 'at', now)
end

if state ~= 'pending' then
  return {state, approvals, denials, 0, 0}
end
if now > expires_at then
  settle('expired')
  return {'expired', approvals, denials, 0, 1}
end
if kind ~= 'approval' and kind ~= 'denial' then
  return {state, approvals, denials, 0, 0}
end

-- Rule 6, here in one atomic step, so no relay process, however many share this store, can count
-- one signer on both sides: nobody outvotes their own veto.
if kind == 'approval' and redis.call('HEXISTS', decisions_key, 'denial:' .. signer) == 1 then
  return {state, approvals, denials, 0, 0}
end

local counted = redis.call('HSETNX', decisions_key, kind .. ':' .. signer, decision)
if counted == 1 then
  -- The decisions hash is born here; it dies with the request's other keys.
  if redis.call('PTTL', decisions_key) == -1 then
    local ttl = redis.call('PTTL', outcome_key)
    if ttl > 0 then
      redis.call('PEXPIRE', decisions_key, ttl)
    end
  end
  if kind == 'approval' then
    approvals = redis.call('HINCRBY', outcome_key, 'approvals', 1)
  else
    -- After HSETNX: the hash never empties here (it would lose its TTL).
    if redis.call('HDEL', decisions_key, 'approval:' .. signer) == 1 then
      approvals = redis.call('HINCRBY', outcome_key, 'approvals', -1)
    end
    denials = redis.call('HINCRBY', outcome_key, 'denials', 1)
  end
  redis.call('XADD', events_key, 'MAXLEN', '~', max_events, '*',
    'type', 'decision', 'kind', kind, 'signer', signer, 'approvals', approvals, 'denials', denials, 'at', now)
end

-- Version 2: teaagent.trust.QuorumPolicy.state over the decisions hash (a signer that denied has
-- no approval there: rule 6 above). A term is met with its required approvals, lost when its
-- approvals and its undecided peers together fall short; both can never hold at once.
local function policy_state()
  local mode, met_all, met_any, lost_all, lost_any = nil, true, false, true, false
  for part in string.gmatch(policy, '[^|]+') do
    if not mode then
      mode = part
    else
      local colon = string.find(part, ':', 1, true)
      local needed = tonumber(string.sub(part, 1, colon - 1))
      local approved, open = 0, 0
      for peer in string.gmatch(string.sub(part, colon + 1), '[^,]+') do
        if redis.call('HEXISTS', decisions_key, 'approval:' .. peer) == 1 then
          approved = approved + 1
        elseif redis.call('HEXISTS', decisions_key, 'denial:' .. peer) == 0 then
          open = open + 1
        end
      end
      local met, lost = approved >= needed, approved + open < needed
      met_all, met_any = met_all and met, met_any or met
      lost_all, lost_any = lost_all and lost, lost_any or lost
    end
  end
  if mode == 'all_of' then
    if met_all then return 'approved' elseif lost_any then return 'denied' end
  else
    if met_any then return 'approved' elseif lost_all then return 'denied' end
  end
  return 'pending'
end

-- teaagent.quorum.quorum_state: with each signer on one side, both can never hold.
local decided = 0
if policy ~= '' then
  state = policy_state()
elseif denials > peers - required then
  state = 'denied'
elseif approvals >= required then
  state = 'approved'
end
if state ~= 'pending' then
  settle(state)
  decided = 1
end
return {state, approvals, denials, counted, decided}
