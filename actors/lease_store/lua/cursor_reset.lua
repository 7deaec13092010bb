-- cursor_reset: an operator moves a job's cursor (after a network reset), fenced and audited.
--
-- KEYS[1] token    KEYS[2] lease    KEYS[3] cursor    KEYS[4] audit    KEYS[5] events
-- ARGV[1] who asks (for the audit)
-- ARGV[2] the new cursor ('' : none, the job starts again at its start_cursor)
-- ARGV[3] the cursor the operator saw ('' : whatever it is now)
-- ARGV[4] audit_maxlen
-- ARGV[5] why (for the audit: the reset mark, or '')
--
-- Refused while a node holds the lease (the job is running: a reset mark holds every node off,
-- so a held lease means no reset was detected) and when ARGV[3] is given and is not the cursor.
-- Applied, the token counter moves on (every term before is fenced: its writes are refused as
-- stale), the cursor is set (or removed), the network fields of a reset are cleared (the
-- passphrase is kept), so is the completeness watermark (it describes the ledgers before the
-- move: a new chain's start its old value would claim as complete), and the audit records who,
-- from and to, and the seam: the last entry of the job's events stream before the move
-- ('entry ID', '' when it has none), where the rows of the chain before end for `audit`.
-- Returns {1, the cursor before ('' for none), the new counter} or {0, reason, detail}, reason one
-- of job-led (detail: the lease's value) or cursor-moved (detail: the cursor now).

local held = redis.call('GET', KEYS[2])
if held then return {0, 'job-led', held} end
local before = redis.call('HGET', KEYS[3], 'cursor') or ''
if ARGV[3] ~= '' and ARGV[3] ~= before then return {0, 'cursor-moved', before} end
local token = redis.call('INCR', KEYS[1])
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[3], 'cursor')
else
  redis.call('HSET', KEYS[3], 'cursor', ARGV[2])
end
redis.call('HDEL', KEYS[3], 'network_reset', 'network_ledger', 'network_ledger_hash',
  'network_ledger_closed_at', 'complete_through', 'complete_held')
local last = redis.call('XREVRANGE', KEYS[5], '+', '-', 'COUNT', 1)
local seam = ''
if #last > 0 then seam = 'entry ' .. last[1][1] end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'event', 'cursor-reset', 'by', ARGV[1],
  'from', before, 'to', ARGV[2], 'token', tostring(token), 'why', ARGV[5], 'seam', seam)
return {1, before, token}
