-- presence: a node's report into the presence hash and onto its channel, stamped with Redis's
-- time (ingestion/serve/presence.py). One key, so one Redis Cluster slot.
--
-- KEYS[1] the presence hash
-- ARGV[1] the node     ARGV[2] the report (JSON; '' removes the node)     ARGV[3] the channel
--
-- Returns the time it stamped, ms (Redis's clock).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], now .. '|' .. ARGV[2])
end
redis.call('PUBLISH', ARGV[3], ARGV[1] .. '|' .. now .. '|' .. ARGV[2])
return now
