-- record_send: this node's own verified decision on a request in its inbox, recorded and, when it
-- counted, queued for the request's origin, on one server in one step (no cluster).
--
-- The relay's steps for its own decision, in their order: record it (record_unlist: counted, the
-- item leaves the pending and held sets once settled), then queue its delivery (enqueue), only
-- when this call counted it: a contrary decision never leaves, and a repeat is queued by its
-- caller, after it checked the repeat is the same decision. Once the delivery is queued, the
-- item's entry leaves the approver's queue (the inbox queue, its "queued" field names it): it
-- waits for nobody any more, and the inbox sweep would only send the decision again.
-- record_unlist and enqueue are defined above this text as local functions of (KEYS, ARGV)
-- (teaagent.store._scripts builds the source). On a Redis Cluster their keys have several hash
-- tags, so the store runs them one by one there.
--
-- KEYS[1...n-2]       record_unlist's KEYS (outcome, decisions, events, pending, held)
-- KEYS[n-1] queue     STREAM  the deliveries queue          (enqueue's KEYS[1])
-- KEYS[n] inbox       STREAM  the approver's queue
-- ARGV[1] count       the number of record_unlist's ARGV
-- ARGV[2...count+1]   record_unlist's ARGV (member, then record_decision's ARGV)
-- ARGV[count+2...]    enqueue's ARGV (group, ttl_ms, max_length, the entry's fields)
--
-- Returns record_decision's reply {state, approvals, denials, counted, decided}, then the entry id
-- when this call counted the decision ("" when the queue was full), or 0 when it queued nothing.
local count = tonumber(ARGV[1])
local reply = record_unlist({unpack(KEYS, 1, #KEYS - 2)}, {unpack(ARGV, 2, count + 1)})
if reply[4] == 1 then
  reply[6] = enqueue({KEYS[#KEYS - 1]}, {unpack(ARGV, count + 2)})
else
  reply[6] = 0
end
if reply[5] == 1 and reply[6] ~= 0 and reply[6] ~= '' then
  local entry = redis.call('HGET', KEYS[1], 'queued')
  if entry then
    redis.call('XDEL', KEYS[#KEYS], entry)
  end
end
return reply
