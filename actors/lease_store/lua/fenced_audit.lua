-- fenced_audit: a job's own audit entry (e.g. a skipped history gap), fenced like a commit.
--
-- KEYS[1] token    KEYS[2] lease    KEYS[3] audit
-- ARGV[1] node     ARGV[2] token    ARGV[3] audit_maxlen    ARGV[4] event
-- ARGV[5..] field, value pairs
--
-- Returns {1, 'ok', token} when written, else {0, reason, counter}.

local refusal = fencing_refusal(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refusal then return {0, refusal[1], refusal[2]} end
local entry = {'event', ARGV[4], 'node', ARGV[1], 'token', ARGV[2]}
for i = 5, #ARGV do entry[#entry + 1] = ARGV[i] end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', unpack(entry))
return {1, 'ok', tonumber(ARGV[2])}
