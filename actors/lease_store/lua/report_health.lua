-- report_health: record a node's source health for a job (Redis time), list the able nodes.
--
-- KEYS[1] the job's health hash (ingestion:{J}:health): field <node> -> ms of its source's last
--         success; field failing:<node> -> ms since which its source has been failing (present
--         only while it fails)
-- ARGV[1] node
-- ARGV[2] age_ms of the node's last source success ('' when it never answered: not recorded)
-- ARGV[3] window_ms
-- ARGV[4] failing_ms: how long the node's source has been failing ('' when it is not: the
--         failing:<node> field is removed)
-- ARGV[5] forget_ms: another node whose last report is older than this (its last success, else
--         the start of its failing) is forgotten, both fields, as the node registry forgets it
--
-- Returns the nodes whose source answered within window_ms and is not failing.

local now = now_ms()
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], ARGV[1], now - tonumber(ARGV[2])) end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'failing:' .. ARGV[1], now - tonumber(ARGV[4]))
else
  redis.call('HDEL', KEYS[1], 'failing:' .. ARGV[1])
end
local all = redis.call('HGETALL', KEYS[1])
local failing, success = {}, {}
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 8) == 'failing:' then
    failing[string.sub(all[i], 9)] = tonumber(all[i + 1])
  else
    success[all[i]] = tonumber(all[i + 1])
  end
end
local forget_before = now - tonumber(ARGV[5])
for node, since in pairs(failing) do
  local last = success[node] or since
  if node ~= ARGV[1] and last < forget_before then
    redis.call('HDEL', KEYS[1], node, 'failing:' .. node)
    success[node] = nil
  end
end
for node, ms in pairs(success) do
  if node ~= ARGV[1] and ms < forget_before then redis.call('HDEL', KEYS[1], node) end
end
local out = {}
for i = 1, #all, 2 do
  local node = all[i]
  if string.sub(node, 1, 8) ~= 'failing:' and not failing[node]
      and now - tonumber(all[i + 1]) <= tonumber(ARGV[3]) then
    table.insert(out, node)
  end
end
return out
