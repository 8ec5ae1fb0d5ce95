-- ack: a delivery done, acknowledged and removed from its queue in one step.
--
-- A script, not a MULTI, so that concurrent acknowledgements share a round trip with the other
-- calls of their moment (teaagent.store._connection.CommandBatches). As in a MULTI, the entry is
-- removed even when the acknowledgement fails (no group: the stream expired and came back), and
-- the failure is the reply.
--
-- KEYS[1] stream      STREAM  the queue
-- ARGV[1] group       its consumer group
-- ARGV[2] entry_id    the delivery's entry
--
-- Returns 1 when the entry was pending (acknowledged now), 0 when it was not.
local acked = redis.pcall('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return acked
