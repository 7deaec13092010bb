-- cursor_reset_sink: the Redis half of an operator's move of a job whose cursor a sink keeps
-- (PostgreSQL), once the sink moved the cursor under the token cursor_reserve.lua took.
--
-- KEYS[1] cursor    KEYS[2] audit
-- ARGV[1] who asks    ARGV[2] the cursor before ('' : none)    ARGV[3] the new cursor ('' : none)
-- ARGV[4] the token   ARGV[5] audit_maxlen    ARGV[6] why (the reset mark, or '')
-- ARGV[7] the seam: where the job's rows before the move end (the sink's 'seq N', '' : none)
--
-- Clears the network fields of a reset (the passphrase is kept) and the completeness watermark,
-- as cursor_reset.lua does, and records who, from, to, the token and the seam in the audit.
-- Returns 1.

redis.call('HDEL', KEYS[1], 'network_reset', 'network_ledger', 'network_ledger_hash',
  'network_ledger_closed_at', 'complete_through', 'complete_held')
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'event', 'cursor-reset', 'by', ARGV[1],
  'from', ARGV[2], 'to', ARGV[3], 'token', ARGV[4], 'why', ARGV[6], 'seam', ARGV[7])
return 1
