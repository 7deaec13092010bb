-- cursor_reserve: an operator's move of a job whose cursor a sink keeps (PostgreSQL) takes a
-- token first, the fencing half of cursor_reset.lua: the sink's fence is then raised to it.
--
-- KEYS[1] token    KEYS[2] lease
--
-- Refused while a node holds the lease (the job is running: a reset mark holds every node off,
-- so a held lease means no reset was detected). Applied, the token counter moves on: every term
-- before is fenced (its writes are refused as stale, in Redis and, once the sink's fence is
-- raised to it, in the sink), every term after has a higher token.
-- Returns {1, the new counter} or {0, 'job-led', the lease's value}.

local held = redis.call('GET', KEYS[2])
if held then return {0, 'job-led', held} end
return {1, redis.call('INCR', KEYS[1])}
