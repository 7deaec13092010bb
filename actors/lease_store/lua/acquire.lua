-- acquire: take a job's lease if it is free, with a new fencing token.
--
-- KEYS[1] lease    ingestion:{J}:lease   ("token|node", expires after ttl_ms)
-- KEYS[2] token    ingestion:{J}:token   (the fencing-token counter; only ever increases)
-- KEYS[3] leader   ingestion:{J}:leader  (hash: node, token, acquired_at_ms, expires_at_ms,
--                  alive_at_ms: the holder's grant, latest renewal or release, Redis time)
-- KEYS[4] audit    ingestion:{J}:audit   (stream)
-- KEYS[5] cursor   ingestion:{J}:cursor  (hash: cursor, token, node)
-- ARGV[1] node     ARGV[2] ttl_ms     ARGV[3] audit_maxlen
-- ARGV[4] known_token: the highest token the caller has seen ('0' for none)
-- ARGV[5] known_committed: '1' when the caller has seen this job commit (a cursor), else '0'
-- Optional, a standby's source-health report carried by its campaign (one round trip instead of
-- a report_health of its own): KEYS[6] the job's health hash (ingestion:{J}:health), ARGV[6]
-- age_ms, ARGV[7] window_ms, ARGV[8] failing_ms, ARGV[9] forget_ms, as report_health takes them.
--
-- Returns {0, lease value, pttl, committed, able, replid} when held (committed: 1 when the job
-- has a cursor, so that standbys learn it); {2, counter, cursor, able, replid} when Redis lost the
-- job's state (nothing issued); else {1, token, previous node, previous token, takeover_ms,
-- cursor, rolled_back_from, able, replid} ('' for each unknown). able: with a health report, the
-- nodes report_health would list; else empty. takeover_ms: how long the job was leaderless,
-- from the previous holder's last sign of life (alive_at_ms; expires_at_ms for a hash written
-- before it). replid: this server's replication id (INFO replication, read here rather than sent
-- as a command of its own beside every acquire; '' when the ACL user may not run INFO), by which
-- a node tells that the primary was replaced.

local function replid()
  local ok, info = pcall(redis.call, 'INFO', 'replication')
  if not ok or type(info) ~= 'string' then return '' end
  return string.match(info, 'master_replid:(%w+)') or ''
end

local able = {}
if KEYS[6] then
  able = record_health(KEYS[6], ARGV[1], ARGV[6], ARGV[7], ARGV[8], ARGV[9])
end
local cursor = redis.call('HGET', KEYS[5], 'cursor') or ''
local held = redis.call('GET', KEYS[1])
if held then
  local committed = 0
  if cursor ~= '' then committed = 1 end
  return {0, held, redis.call('PTTL', KEYS[1]), committed, able, replid()}
end
-- The caller has seen fencing token known_token. A counter below it means Redis went back in time:
-- a failover to a replica that missed the newest writes, a restart from an old file, a restore.
local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
local known = tonumber(ARGV[4] or '0')
if counter < known and cursor == '' and ARGV[5] == '1' then
  -- Not a rollback but a loss: the job had committed (the caller saw it) and its cursor is gone
  -- too. Leading would restart the job from its start cursor; that is an operator's decision,
  -- so issue nothing. (A job that never committed lost nothing: it is floored like a rollback.)
  return {2, counter, cursor, able, replid()}
end
local now = now_ms()
-- The counter only ever increases. Floor it at every token known to be used: the caller's, and
-- the committed cursor's (the counter can be lost while the cursor survives). The new token is then
-- above every token this node has seen and every token on a surviving commit.
local floor = math.max(known, tonumber(redis.call('HGET', KEYS[5], 'token') or '0'))
if counter < floor then
  redis.call('SET', KEYS[2], floor)
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. '|' .. ARGV[1], 'PX', ARGV[2])
local prev = redis.call('HMGET', KEYS[3], 'node', 'token', 'alive_at_ms', 'expires_at_ms')
-- A holder that crashed led nobody since its last renewal at the latest: its lease's remaining
-- TTL is part of the outage (counting from the expiry would report a few ms of jitter).
local alive = prev[3] or prev[4]
local takeover = ''
if alive then takeover = math.max(0, now - tonumber(alive)) end
local rolled_back = ''
if counter < known then rolled_back = counter end
redis.call('HSET', KEYS[3], 'node', ARGV[1], 'token', token,
  'acquired_at_ms', now, 'expires_at_ms', now + tonumber(ARGV[2]), 'alive_at_ms', now)
local entry = {'event', 'became-leader', 'node', ARGV[1], 'token', token,
  'previous_node', prev[1] or '', 'previous_token', prev[2] or '', 'takeover_ms', takeover}
if rolled_back ~= '' then
  table.insert(entry, 'rolled_back_from')
  table.insert(entry, rolled_back)
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*', unpack(entry))
return {1, token, prev[1] or '', prev[2] or '', takeover, cursor, rolled_back, able, replid()}
