-- drop_dead_letters: give up a webhook job's dead letters committed before a bound, a page at a
-- time (`ingestion webhooks drop-dead-letters`). Not fenced by a lease token (the command holds
-- none, and a job with no leader can be cleaned up too): one page is one atomic step, and the
-- leader only ever appends newer dead letters (through its fenced commit) or marks one replayed.
--
-- KEYS[1] the job's events stream (its dead letters)   KEYS[2] replayed (record id -> ms)
-- KEYS[3] endpoint (hash)                              KEYS[4] the job's audit stream
-- ARGV[1] the bound: a stream id, exclusive ('+': every dead letter)
-- ARGV[2] at most this many dead letters a call        ARGV[3] who asked
-- ARGV[4] the audit's max length                       ARGV[5] the bound as asked ('' for none)
--
-- Deletes the dead letters below the bound (at most ARGV[2]) and their marks in `replayed`, adds
-- their number to the endpoint's `dead_letters_dropped` (with `dropped_at_ms`, `dropped_by`,
-- `dropped_before`), and appends a `dead-letters-dropped` entry to the audit (`by`, `dropped`,
-- `replayed`: how many of them had been replayed, `before`, `first`, `last`).
-- Returns {dropped, of them replayed, 1 when a full page was dropped (call again), else 0}.

local rows
if ARGV[1] == '+' then
  rows = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', ARGV[2])
else
  rows = redis.call('XRANGE', KEYS[1], '-', '(' .. ARGV[1], 'COUNT', ARGV[2])
end
if #rows == 0 then return {0, 0, 0} end
local replayed = 0
for _, row in ipairs(rows) do
  local fields = row[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'paging_token' then
      replayed = replayed + redis.call('HDEL', KEYS[2], fields[i + 1])
    end
  end
  redis.call('XDEL', KEYS[1], row[1])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HINCRBY', KEYS[3], 'dead_letters_dropped', #rows)
redis.call('HSET', KEYS[3], 'dropped_at_ms', now, 'dropped_by', ARGV[3], 'dropped_before', ARGV[5])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'event', 'dead-letters-dropped',
  'by', ARGV[3], 'dropped', #rows, 'replayed', replayed, 'before', ARGV[5],
  'first', rows[1][1], 'last', rows[#rows][1])
local more = 0
if #rows == tonumber(ARGV[2]) then more = 1 end
return {#rows, replayed, more}
