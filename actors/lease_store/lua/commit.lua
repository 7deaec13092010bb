-- commit: append records to the events stream and move the cursor, fenced by the writer's token.
--
-- KEYS[1] token    KEYS[2] lease    KEYS[3] cursor    KEYS[4] events
-- ARGV[1] node     ARGV[2] token
-- ARGV[3] the cursor the writer believes is committed ('' for none)
-- ARGV[4] anchor ('' for none): when given, it becomes the cursor after the records (it must come
--         after the last of them). Alone, it is how a job that starts at "now" pins that position
--         durably before its first record; after records, a source's "read through here" position
--         (Stellar RPC's scanned-through cursor).
-- ARGV[5] events max_len (0: keep everything)
-- ARGV[6] the completeness watermark ('' for none): "L" (every record of the source for ledgers up
--         to L is committed once this commit is) or "L|why" (and a known gap follows L: the
--         watermark stops at L for good). Kept in the cursor hash beside the cursor, under the same
--         fencing check: field complete_through (it only rises) and complete_held (why it stopped).
-- ARGV[7..] paging_token, record pairs, strictly in paging-token order
--
-- Applied only if the token is the counter, the lease holds exactly "token|node", the stored cursor
-- is ARGV[3], and every paging token is well formed and after the previous one; else nothing changes.
-- Returns {1, records appended, new cursor, entries trimmed, watermark ('' none), held ('' none),
-- 1 when this commit made it held else 0} or {0, reason, counter, stored cursor},
-- reason one of stale-token, lease-lost, cursor-moved, not-after-cursor, bad-paging-token.

local FIRST = 7  -- the first record's paging token
local stored = redis.call('HGET', KEYS[3], 'cursor') or ''
local refusal = fencing_refusal(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refusal then return {0, refusal[1], refusal[2], stored} end
local current = tonumber(ARGV[2])
if stored ~= ARGV[3] then return {0, 'cursor-moved', current, stored} end
-- Stellar RPC's ids, "%019d-%010d": two of them order as text exactly as they order as numbers
-- (one width, the '-' at one place: the first character that differs is a digit of the position
-- or, positions equal, of the sub-position). So consecutive ids skip split_token, which is most of
-- this script's time per record; any other shape takes the general rule.
local PADDED = '^' .. string.rep('%d', 19) .. '%-' .. string.rep('%d', 10) .. '$'
local function padded(t)
  return string.find(t, PADDED) ~= nil
end
local last, last_padded = stored, padded(stored)
for i = FIRST, #ARGV, 2 do
  local t = ARGV[i]
  local p = padded(t)
  if p and last_padded then
    if not (last < t) then return {0, 'not-after-cursor', current, stored} end
  else
    if not split_token(t) then return {0, 'bad-paging-token', current, stored} end
    if last ~= '' and not is_after(t, last) then
      return {0, 'not-after-cursor', current, stored}
    end
  end
  last, last_padded = t, p
end
if ARGV[4] ~= '' then
  if not split_token(ARGV[4]) then return {0, 'bad-paging-token', current, stored} end
  if last ~= '' and not is_after(ARGV[4], last) then
    return {0, 'not-after-cursor', current, stored}
  end
  last = ARGV[4]
end
for i = FIRST, #ARGV, 2 do
  redis.call('XADD', KEYS[4], '*', 'paging_token', ARGV[i], 'token', ARGV[2],
    'node', ARGV[1], 'record', ARGV[i + 1])
end
redis.call('HSET', KEYS[3], 'cursor', last, 'token', ARGV[2], 'node', ARGV[1])
local mark = redis.call('HGET', KEYS[3], 'complete_through') or ''
local held = redis.call('HGET', KEYS[3], 'complete_held') or ''
local newly_held = 0
if ARGV[6] ~= '' and held == '' then
  local sep = string.find(ARGV[6], '|', 1, true)
  local ledger = tonumber(sep and string.sub(ARGV[6], 1, sep - 1) or ARGV[6])
  if ledger and (mark == '' or ledger > tonumber(mark)) then
    mark = tostring(ledger)
    redis.call('HSET', KEYS[3], 'complete_through', mark)
  end
  if sep then
    held = string.sub(ARGV[6], sep + 1)
    if held == '' then held = 'held' end
    redis.call('HSET', KEYS[3], 'complete_held', held)
    newly_held = 1
  end
end
local trimmed = 0
if #ARGV >= FIRST then trimmed = trim_events(KEYS[4], tonumber(ARGV[5])) end
return {1, (#ARGV - FIRST + 1) / 2, last, trimmed, mark, held, newly_held}
