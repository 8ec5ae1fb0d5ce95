-- accept_request: store one request document once, with its counting state and its first event.
--
-- KEYS[1] doc         STRING  the signed document, kept verbatim
-- KEYS[2] outcome     HASH    counting parameters and state
-- KEYS[3] events      STREAM  the request's events
-- ARGV[1] document    the document's bytes
-- ARGV[2] required    approvals needed, an integer >= 1
-- ARGV[3] peers       number of peers, an integer >= required
-- ARGV[4] expires_at  Unix seconds
-- ARGV[5] now         Unix seconds on the caller's clock (the server clock decides nothing here)
-- ARGV[6] retention   seconds the keys outlive expires_at
-- ARGV[7] max_events  bound on the events stream
--
-- Returns {status, state}: status is "created", "duplicate" (the very same bytes were stored before)
-- or "conflict" (other bytes hold this id; nothing is written).
local doc_key, outcome_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local document = ARGV[1]
local required, peers = tonumber(ARGV[2]), tonumber(ARGV[3])
local expires_at, now = tonumber(ARGV[4]), tonumber(ARGV[5])
local retention, max_events = tonumber(ARGV[6]), tonumber(ARGV[7])

local existing = redis.call('GET', doc_key)
if existing then
  local state = redis.call('HGET', outcome_key, 'state') or 'pending'
  if existing == document then
    return {'duplicate', state}
  end
  return {'conflict', state}
end

local ttl = math.max(expires_at - now, 0) + retention
local state = 'pending'
if now > expires_at then
  state = 'expired'
end
redis.call('SET', doc_key, document, 'EX', ttl)
redis.call('HSET', outcome_key,
  'state', state, 'required', required, 'peers', peers, 'expires_at', expires_at,
  'approvals', 0, 'denials', 0, 'accepted_at', now)
if state ~= 'pending' then
  redis.call('HSET', outcome_key, 'decided_at', now)
end
redis.call('EXPIRE', outcome_key, ttl)
redis.call('XADD', events_key, 'MAXLEN', '~', max_events, '*', 'type', 'accepted', 'state', 'pending', 'at', now)
if state ~= 'pending' then
  redis.call('XADD', events_key, 'MAXLEN', '~', max_events, '*',
    'type', 'outcome', 'state', state, 'approvals', 0, 'denials', 0, 'at', now)
end
redis.call('EXPIRE', events_key, ttl)
return {'created', state}
