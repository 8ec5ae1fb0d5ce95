-- receive_request: a peer's verified request, received on one server in one step (no cluster).
--
-- The relay's five steps for a new request, in their order and with their conditions, inside one
-- script: count it against its origin's share of the inbox (hold), charge the origin's window
-- (ratelimit), list and store the request (the index entries, then accept_request), queue it for
-- the approver (enqueue) and mark it queued (mark_queued). The first four are the very scripts the
-- steps run, defined above this text as local functions of (KEYS, ARGV) (teaagent.store._scripts
-- builds the source); the mark is mark_queued's HSET, written here. On a Redis Cluster their keys
-- have several hash tags, so the store runs them one by one there instead.
--
-- A request already stored is charged nothing and written nothing ("stored"): the relay reads it
-- and answers a repeat. An origin that already holds its cap of pending requests is charged
-- nothing either ("full": its window is not touched). A refused window writes nothing ("refused":
-- the hold is taken back, within this one step, so nobody sees it).
--
-- KEYS[1] doc         STRING  the item's document          (accept_request's KEYS[1])
-- KEYS[2] outcome     HASH    the item's counting state    (accept_request's KEYS[2], mark_queued's KEYS[1])
-- KEYS[3] events      STREAM  the item's events            (accept_request's KEYS[3])
-- KEYS[4] index       ZSET    every received ref
-- KEYS[5] pending     ZSET    the pending received refs
-- KEYS[6] window      STRING  the origin's GCRA bucket     (ratelimit's KEYS[1])
-- KEYS[7] queue       STREAM  the approver's queue         (enqueue's KEYS[1])
-- KEYS[8] held        ZSET    the origin's pending refs    (hold's KEYS[1])
-- ARGV[1] member      the item's ref in the index, <origin>/<request_id>
-- ARGV[2] expires_at  Unix seconds, the ref's score
-- ARGV[3] index_ms    the index entries' TTL in milliseconds (it only grows)
-- ARGV[4..6]          ratelimit's ARGV (interval, capacity, now)
-- ARGV[7..13]         accept_request's ARGV (document ... max_events; ARGV[11] is now, in seconds)
-- ARGV[14] cap        hold's cap: the pending requests the origin may hold
-- ARGV[15] held_ms    hold's ttl_ms
-- ARGV[16...]         enqueue's ARGV (group, ttl_ms, max_length, the entry's fields)
--
-- Returns {"stored"}, {"full", held} (hold's negative reply, negated), {"refused", retry}
-- (ratelimit's negative reply) or {"created", state, remaining, entry_id}: entry_id is "" when the
-- request was not pending (not queued) or the queue was full (the item stays unmarked: the
-- origin's repeat queues it).
local doc_key, outcome_key, held_key, member = KEYS[1], KEYS[2], KEYS[8], ARGV[1]

if redis.call('EXISTS', doc_key) == 1 then
  return {'stored'}
end
local held = hold({held_key}, {member, ARGV[2], ARGV[11], ARGV[14], ARGV[15]})
if held < 0 then
  return {'full', -held}
end
local remaining = ratelimit({KEYS[6]}, {ARGV[4], ARGV[5], ARGV[6]})
if remaining < 0 then
  redis.call('ZREM', held_key, member)
  return {'refused', remaining}
end
-- The index entries first, as the steps write them; NX: a ref keeps its first score.
for _, key in ipairs({KEYS[4], KEYS[5]}) do
  redis.call('ZADD', key, 'NX', ARGV[2], member)
  if redis.call('PTTL', key) < tonumber(ARGV[3]) then  -- the TTL only grows (-1: it had none)
    redis.call('PEXPIRE', key, ARGV[3])
  end
end
local accepted = accept_request({doc_key, outcome_key, KEYS[3]}, {unpack(ARGV, 7, 13)})
local state, entry_id = accepted[2], ''
if state == 'pending' then
  entry_id = enqueue({KEYS[7]}, {unpack(ARGV, 16)})
  if entry_id ~= '' then
    -- mark_queued's step; its look is not needed: accept_request has just written the outcome.
    redis.call('HSET', outcome_key, 'queued', entry_id)
  end
else
  -- Accepted already expired: never pending, and never held.
  redis.call('ZREM', KEYS[5], member)
  redis.call('ZREM', held_key, member)
end
return {'created', state, remaining, entry_id}
