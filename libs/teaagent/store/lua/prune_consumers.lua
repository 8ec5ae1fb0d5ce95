-- prune_consumers: remove a group's consumers that hold nothing and have been silent a long time.
--
-- Every relay process reads a queue under a consumer name of its own (<host>-<pid>), so each
-- restart leaves a consumer behind. Its pending entries are reclaimed by the live ones (XAUTOCLAIM),
-- but the name stays in the group. A consumer is removed only when it holds no pending entry (a
-- removed consumer's pending entries could never be claimed again) and it has not read for
-- min_idle_ms, far longer than a live worker's longest block: the check and the removal are one
-- atomic step, so no entry can reach it in between.
--
-- KEYS[1] stream     the queue's stream
-- ARGV[1] group      its consumer group
-- ARGV[2] min_idle   milliseconds since the consumer's last read, at least
-- ARGV[3] keep       the caller's own consumer name, never removed
--
-- Returns the names removed.
local removed = {}
local consumers = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if consumers['err'] then
  return removed  -- no stream or no group yet: nothing to prune
end
local min_idle = tonumber(ARGV[2])
for _, consumer in ipairs(consumers) do
  local fields = {}
  for i = 1, #consumer, 2 do
    fields[consumer[i]] = consumer[i + 1]
  end
  if fields['name'] ~= ARGV[3] and fields['pending'] == 0 and fields['idle'] >= min_idle then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], fields['name'])
    removed[#removed + 1] = fields['name']
  end
end
return removed
