-- plan: write a backfill's plan, or find the one it resumes, in one step (no other plan can be
-- written between the read and the write).
--
-- KEYS[1] the plan (ingestion:{JOB}:backfill)
-- ARGV[1] first ledger    ARGV[2] last ledger
-- ARGV[3] ranges asked for ('0': not given)    ARGV[4] ranges by default (the live nodes')
-- ARGV[5] created_at    ARGV[6] created_by
--
-- A plan of the same span (same first and last) keeps its ranges whatever the node count: its
-- ranges are jobs named after their bounds, with cursors and rows of their own, and another
-- split would commit their ledgers again under other names.
--
-- Returns {'planned', ranges} for a new plan; {'resumed', ranges} for the same span again (its
-- state back to running); {'busy', first, last, ranges} when another span's plan runs (nothing
-- written); {'split', ranges, state} when the same span was planned in other ranges than asked
-- (nothing written).

local plan = redis.call('HMGET', KEYS[1], 'first', 'last', 'ranges', 'state')
local first, last, ranges, state = plan[1], plan[2], plan[3], plan[4] or 'running'
if first and last and ranges then
  local same = first == ARGV[1] and last == ARGV[2]
  if not same and state == 'running' then
    return {'busy', first, last, ranges}
  end
  if same then
    if ARGV[3] ~= '0' and ARGV[3] ~= ranges then
      return {'split', ranges, state}
    end
    if state ~= 'running' then
      redis.call('HSET', KEYS[1], 'state', 'running', 'resumed_at', ARGV[5], 'resumed_by', ARGV[6])
      redis.call('HDEL', KEYS[1], 'finished_at', 'cancelled_at')
    end
    return {'resumed', ranges}
  end
end
local chosen = ARGV[3]
if chosen == '0' then chosen = ARGV[4] end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'first', ARGV[1], 'last', ARGV[2], 'ranges', chosen, 'state', 'running',
           'created_at', ARGV[5], 'created_by', ARGV[6])
return {'planned', chosen}
