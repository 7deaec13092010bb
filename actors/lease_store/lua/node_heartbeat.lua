-- node_heartbeat: record a node as live (Redis's clock), forget nodes long silent, list the live.
--
-- KEYS[1] the node registry (ingestion:nodes, a sorted set scored by Redis time in ms)
-- ARGV[1] node     ARGV[2] live_ms     ARGV[3] forget_ms
--
-- Returns the nodes that heartbeat within live_ms.

local now = now_ms()
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]))
return redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[2]), '+inf')
