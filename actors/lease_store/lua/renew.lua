-- renew: extend the lease if it still holds exactly this holder and token.
--
-- KEYS[1] lease    KEYS[2] leader (hash; an operator's hand-over request is its fields
--                  handover_token and handover_by)
-- ARGV[1] node     ARGV[2] token     ARGV[3] ttl_ms
--
-- Returns {1, ''} when renewed (the leader hash's expires_at_ms and alive_at_ms moved on, Redis
-- time), {0, ''} when the lease is not (or no longer) this holder's, {2, by} when renewed and an
-- operator asked this very term to hand over (the request stays while the term lasts, so a
-- renewal whose answer was lost does not lose it; a request naming another term is dropped:
-- that term is over). Two keys that exist while a term runs: a renewal goes on
-- during a cluster slot migration (a missing key there would make it a partial multi-key request).

if redis.call('GET', KEYS[1]) ~= ARGV[2] .. '|' .. ARGV[1] then return {0, ''} end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local now = now_ms()
redis.call('HSET', KEYS[2], 'expires_at_ms', now + tonumber(ARGV[3]), 'alive_at_ms', now)
local asked = redis.call('HMGET', KEYS[2], 'handover_token', 'handover_by')
if asked[1] then
  if asked[1] == ARGV[2] then return {2, asked[2] or ''} end
  redis.call('HDEL', KEYS[2], 'handover_token', 'handover_by')
end
return {1, ''}
