-- release: give the lease up, if still this holder's, and wake the standbys.
--
-- KEYS[1] lease    KEYS[2] leader    KEYS[3] audit
-- ARGV[1] node     ARGV[2] token     ARGV[3] the release channel (ingestion:{J}:released)
-- ARGV[4] audit_maxlen    ARGV[5] why, when it is said: 'handed-over' (an operator asked) or
--         'node-exiting' (the node is going away: its worker died and its parent released)
--
-- Returns 1 when released (and "token|node" published on the channel, "token|node|REASON" when
-- a reason is given, which standbys held off at their share take over at once; the leader hash's
-- expires_at_ms and alive_at_ms set to now: leaderless from here), 0 when it was not ours.

if redis.call('GET', KEYS[1]) ~= ARGV[2] .. '|' .. ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
local now = now_ms()
redis.call('HSET', KEYS[2], 'expires_at_ms', now, 'alive_at_ms', now)
local entry = {'event', 'released', 'node', ARGV[1], 'token', ARGV[2]}
local notice = ARGV[2] .. '|' .. ARGV[1]
local why = ARGV[5] or ''
if why ~= '' then
  table.insert(entry, 'reason')
  table.insert(entry, why)
  notice = notice .. '|' .. why
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', unpack(entry))
redis.call('PUBLISH', ARGV[3], notice)
return 1
