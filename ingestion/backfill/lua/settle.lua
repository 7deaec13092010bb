-- settle: move a backfill's plan from 'running' to 'done' or 'cancelled', if it is still that
-- plan and still running (a node's runner, the CLI's progress and --cancel may race: one wins,
-- the others change nothing).
--
-- KEYS[1] the plan (ingestion:{JOB}:backfill)
-- ARGV[1] first ledger    ARGV[2] last ledger    ARGV[3] ranges    (the plan it must still be)
-- ARGV[4] the new state ('done' or 'cancelled')    ARGV[5] when (ISO time, for the operator)
--
-- Returns {1, new state} when moved; {0, state} when the plan was not running (its state, or
-- '' when the hash holds another plan or none).

local plan = redis.call('HMGET', KEYS[1], 'first', 'last', 'ranges', 'state')
if plan[1] ~= ARGV[1] or plan[2] ~= ARGV[2] or plan[3] ~= ARGV[3] then return {0, ''} end
local state = plan[4] or 'running'
if state ~= 'running' then return {0, state} end
local field = 'finished_at'
if ARGV[4] == 'cancelled' then field = 'cancelled_at' end
redis.call('HSET', KEYS[1], 'state', ARGV[4], field, ARGV[5])
return {1, ARGV[4]}
