-- fenced_hset: a singleton job's side effect, fenced exactly like a commit: applied only for the
-- current token while its holder still holds the lease.
--
-- KEYS[1] token    KEYS[2] lease    KEYS[3] the target hash (with the job's hash tag on a cluster)
-- ARGV[1] node     ARGV[2] token    ARGV[3..] field, value pairs
--
-- Returns {1, 'ok', token} when applied, else {0, reason, counter}.

local refusal = fencing_refusal(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refusal then return {0, refusal[1], refusal[2]} end
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
return {1, 'ok', tonumber(ARGV[2])}
