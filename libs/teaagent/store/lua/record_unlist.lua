-- record_unlist: record_decision, and, when that call settles the outcome, the request leaves its
-- book's pending set (and, in an inbox, its origin's held set) in the same step: one server only.
--
-- record_decision is defined above this text as a local function of (KEYS, ARGV)
-- (teaagent.store._scripts builds the source). The sets have no hash tag of a request: on a Redis
-- Cluster the store runs record_decision alone and removes the member after it (Book._unlist_pending).
--
-- KEYS[1] outcome     HASH    (record_decision's KEYS[1])
-- KEYS[2] decisions   HASH    (record_decision's KEYS[2])
-- KEYS[3] events      STREAM  (record_decision's KEYS[3])
-- KEYS[4...]          ZSET    the sets the request leaves once settled: the pending set, the held set
-- ARGV[1] member      the request's member in those sets
-- ARGV[2...]          record_decision's ARGV (kind ... max_events [, policy])
--
-- Returns record_decision's reply.
local reply = record_decision({KEYS[1], KEYS[2], KEYS[3]}, {unpack(ARGV, 2)})
if reply[5] == 1 then
  for index = 4, #KEYS do
    redis.call('ZREM', KEYS[index], ARGV[1])
  end
end
return reply
