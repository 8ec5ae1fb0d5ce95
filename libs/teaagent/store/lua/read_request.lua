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
-- Returns {doc or false, outcome's fields and values, decisions' [, deliveries']}; a request not
-- stored is {false, {}, {}[, {}]}, nothing else of it read.
local reply = {redis.call('GET', KEYS[1])}
for index = 2, #KEYS do
  reply[index] = {}
end
if not reply[1] then
  return reply
end
local outcome = redis.call('HGETALL', KEYS[2])
reply[2] = outcome
-- record_decision keeps one field in the decisions hash per decision it counts, approvals plus
-- denials: with both counts at 0 the hash is empty, and not read.
local counts = {}
for index = 1, #outcome, 2 do
  counts[outcome[index]] = outcome[index + 1]
end
if counts['approvals'] ~= '0' or counts['denials'] ~= '0' then
  reply[3] = redis.call('HGETALL', KEYS[3])
end
for index = 4, #KEYS do
  reply[index] = redis.call('HGETALL', KEYS[index])
end
return reply
