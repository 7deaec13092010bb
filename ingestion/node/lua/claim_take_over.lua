-- claim_take_over: take a node id's claim from a holder that is gone (ingestion/node/claim.py),
-- only if the claim still holds exactly the value seen.
--
-- KEYS[1] the claim
-- ARGV[1] the exact value seen     ARGV[2] the new value     ARGV[3] PX (ms)
--
-- Returns 1 when taken, 0 when the claim changed since.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
