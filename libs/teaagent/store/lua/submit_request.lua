-- submit_request: this node's own verified request, stored and queued for its peers on one server
-- in one step (no cluster).
--
-- The relay's steps for a submission, in their order: list and store the request (the index
-- entries, then accept_request) and, while it is pending, queue one delivery per peer (enqueue),
-- a repeat's included (a client retrying after a crash completes its deliveries; the peers take a
-- request once). accept_request and enqueue are defined above this text as local functions of
-- (KEYS, ARGV) (teaagent.store._scripts builds the source). On a Redis Cluster their keys have
-- two hash tags, so the store runs them one by one there instead.
--
-- KEYS[1] doc         STRING  the request's document       (accept_request's KEYS[1])
-- KEYS[2] outcome     HASH    its counting state           (accept_request's KEYS[2])
-- KEYS[3] events      STREAM  its events                   (accept_request's KEYS[3])
-- KEYS[4] index       ZSET    every own request id
-- KEYS[5] pending     ZSET    the pending own request ids
-- KEYS[6] queue       STREAM  the deliveries queue         (enqueue's KEYS[1])
-- ARGV[1] member      the request's id in the index
-- ARGV[2] expires_at  Unix seconds, the id's score
-- ARGV[3] index_ms    the index entries' TTL in milliseconds (it only grows)
-- ARGV[4..10]         accept_request's ARGV (document ... max_events)
-- ARGV[11] count      the number of deliveries
-- ARGV[12] width      the number of enqueue arguments of each
-- ARGV[13...]         each delivery's enqueue ARGV (group, ttl_ms, max_length, the entry's fields)
--
-- Returns {status, state, entry_id...}: accept_request's reply, then, when the request is pending
-- and not in conflict, each delivery's entry id ("" when the queue was full).
local member = ARGV[1]

-- The index entries first, as the steps write them; NX: a refused document never moves its entry.
for _, key in ipairs({KEYS[4], KEYS[5]}) do
  redis.call('ZADD', key, 'NX', ARGV[2], member)
  if redis.call('PTTL', key) < tonumber(ARGV[3]) then  -- the TTL only grows (-1: it had none)
    redis.call('PEXPIRE', key, ARGV[3])
  end
end
local accepted = accept_request({KEYS[1], KEYS[2], KEYS[3]}, {unpack(ARGV, 4, 10)})
local status, state = accepted[1], accepted[2]
if state ~= 'pending' then
  redis.call('ZREM', KEYS[5], member)  -- accepted already expired, or a repeat of a settled one
  return accepted
end
if status == 'conflict' then
  return accepted
end
local count, width = tonumber(ARGV[11]), tonumber(ARGV[12])
for i = 0, count - 1 do
  local first = 13 + i * width
  accepted[#accepted + 1] = enqueue({KEYS[6]}, {unpack(ARGV, first, first + width - 1)})
end
return accepted
