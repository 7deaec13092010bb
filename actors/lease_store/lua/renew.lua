-- renew: extend the lease if it still holds exactly this holder and token.
--
-- KEYS[1] lease    KEYS[2] leader
-- ARGV[1] node     ARGV[2] token     ARGV[3] ttl_ms
--
-- Returns 1 when renewed (the leader hash's expires_at_ms and alive_at_ms moved on, Redis time),
-- 0 when the lease is not (or no longer) this holder's.

if redis.call('GET', KEYS[1]) ~= ARGV[2] .. '|' .. ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local now = now_ms()
redis.call('HSET', KEYS[2], 'expires_at_ms', now + tonumber(ARGV[3]), 'alive_at_ms', now)
return 1
