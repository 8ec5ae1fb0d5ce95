-- mark_queued: note on a stored inbox item that it was queued for this node's approver.
--
-- A repeat of a request then queues nothing: re-posting a captured request never fills the queue.
-- Written after the queue entry (another hash tag, so another step): a crash between the two
-- leaves the item unmarked, and the origin's repeat queues it then.
--
-- KEYS[1] outcome     HASH    the item's counting state (written by accept_request)
-- ARGV[1] entry_id    the queue entry's id, kept for an operator
--
-- Returns 1 when marked, 0 when no item is stored (nothing is written: no key without a TTL).
local outcome_key, entry_id = KEYS[1], ARGV[1]

if redis.call('EXISTS', outcome_key) == 0 then
  return 0
end
redis.call('HSET', outcome_key, 'queued', entry_id)
return 1
