-- report_health: record when a node's source last answered (Redis time), list the healthy nodes.
--
-- KEYS[1] the job's health hash (ingestion:{J}:health: node -> ms of its last source success)
-- ARGV[1] node
-- ARGV[2] age_ms of the node's last source success ('' when it does not answer now: not recorded)
-- ARGV[3] window_ms
--
-- Returns the nodes whose source answered within window_ms.

local now = now_ms()
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], ARGV[1], now - tonumber(ARGV[2])) end
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if now - tonumber(all[i + 1]) <= tonumber(ARGV[3]) then table.insert(out, all[i]) end
end
return out
