-- claim_release: delete this instance's claim of its node id on a clean exit
-- (ingestion/node/claim.py), never another instance's.
--
-- KEYS[1] the claim
-- ARGV[1] this instance's id
--
-- Returns 1 when deleted, 0 when the claim is not this instance's.

local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
  return redis.call('DEL', KEYS[1])
end
return 0
