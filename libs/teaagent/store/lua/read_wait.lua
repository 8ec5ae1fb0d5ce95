-- read_wait: where a wait for a request's outcome starts, in one call (a read: nothing is written).
--
-- The state and the last event's id at the same instant, so that no event slips between them;
-- a script, not a MULTI, so that concurrent waits share a round trip with the other calls of
-- their moment (teaagent.store._connection.CommandBatches).
--
-- KEYS[1] outcome     HASH    the request's counting state
-- KEYS[2] events      STREAM  its events
--
-- Returns {state, expires_at, approvals, denials, last event id}: each false when absent.
local reply = redis.call('HMGET', KEYS[1], 'state', 'expires_at', 'approvals', 'denials')
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
reply[5] = last[1] and last[1][1] or false
return reply
