-- read_request: one stored request as it is at one moment, in one call (a read: nothing is written).
--
-- A script, not a MULTI, so that concurrent reads share a round trip with the other calls of
-- their moment (teaagent.store._connection.CommandBatches); like a MULTI it reads every part at
-- the same instant.
--
-- KEYS[1] doc         STRING  the signed request as stored
-- KEYS[2] outcome     HASH    its counting state
-- KEYS[3] decisions   HASH    its decisions by signer
-- KEYS[4] deliveries  HASH    (optional) its delivery report by peer
--
-- Returns {doc or false, outcome's fields and values, decisions' [, deliveries']}.
local reply = {redis.call('GET', KEYS[1])}
for index = 2, #KEYS do
  reply[index] = redis.call('HGETALL', KEYS[index])
end
return reply
