-- claim_renew: keep this instance's claim of its node id (ingestion/node/claim.py).
--
-- KEYS[1] the claim
-- ARGV[1] this instance's id     ARGV[2] the new value     ARGV[3] PX (ms)
--
-- Returns 1 when renewed (or claimed again: it had expired and nobody took it), else the
-- holder's value.

local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then
  return v
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
