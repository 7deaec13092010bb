-- Shared helpers, prepended to every script of the lease store (a script cannot call another).
--
-- Paging tokens are compared as decimal strings by (length, text) once leading zeros are stripped
-- (Stellar RPC's event ids are zero-padded), which is numeric order; Redis's Lua numbers are
-- doubles and cannot hold every int64.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- A decimal without its leading zeros ('0' for zero), or nil when not all digits.
local function digits(s)
  if string.match(s, '^[0-9]+$') == nil then return nil end
  local stripped = string.gsub(s, '^0+', '')
  if stripped == '' then return '0' end
  return stripped
end
local function split_token(t)
  local dash = string.find(t, '-', 1, true)
  local a, b = t, '0'
  if dash then a, b = string.sub(t, 1, dash - 1), string.sub(t, dash + 1) end
  a, b = digits(a), digits(b)
  if not (a and b) then return nil end
  return a, b
end
local function num_lt(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
-- nil when (token, node) may write: the token is the counter and the lease holds exactly it;
-- else {reason, current counter}
local function fencing_refusal(token_key, lease_key, node, token)
  local current = tonumber(redis.call('GET', token_key) or '0')
  if current ~= tonumber(token) then return {'stale-token', current} end
  if redis.call('GET', lease_key) ~= token .. '|' .. node then return {'lease-lost', current} end
  return nil
end
-- true when paging token t sorts strictly after paging token prev
local function is_after(t, prev)
  local ta, na = split_token(t)
  local pa, pn = split_token(prev)
  if ta == pa then return num_lt(pn, na) end
  return num_lt(pa, ta)
end

-- Stream ids "ms-seq", compared as numbers (both fit a double for ids from XADD *).
local function id_parts(id)
  local dash = string.find(id, '-', 1, true)
  if not dash then return tonumber(id), 0 end
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end
local function id_lt(a, b)
  local am, as = id_parts(a)
  local bm, bs = id_parts(b)
  if am ~= bm then return am < bm end
  return as < bs
end
local function id_next(id)
  local ms, seq = id_parts(id)
  return string.format('%d-%d', ms, seq + 1)
end
-- Entries of stream `key` from id `from` (inclusive) to `to` (inclusive), counting at most `limit`.
local function count_range(key, from, to, limit)
  return #redis.call('XRANGE', key, from, to, 'COUNT', limit)
end
-- Trim the events stream to about max_len entries, never removing an entry that a consumer group
-- has not acknowledged (pending) or not yet been delivered. Each group needs every entry from its
-- floor: its oldest pending entry, or the one after its last delivered one. With `held` the most
-- entries any group needs (from the oldest floor to the end): when held <= max_len, trimming to
-- max_len entries keeps every needed one; else trim only below the oldest floor. Both trims are
-- approximate (~): Redis drops whole stream nodes only, so they cost next to nothing per commit.
-- Returns the number of entries removed.
local function trim_events(key, max_len)
  if max_len <= 0 or redis.call('XLEN', key) <= max_len then return 0 end
  local groups = redis.call('XINFO', 'GROUPS', key)
  if #groups == 0 then return redis.call('XTRIM', key, 'MAXLEN', '~', max_len) end
  local floor, held = nil, 0
  for _, g in ipairs(groups) do
    local f = {}
    for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    local pending = redis.call('XPENDING', key, f['name'])
    local lag = f['lag']  -- entries not yet delivered; false when Redis cannot tell
    local g_floor, g_held
    if tonumber(pending[1]) > 0 then
      g_floor = pending[2]
      if lag then
        g_held = lag + count_range(key, g_floor, f['last-delivered-id'], max_len + 1)
      end
    else
      g_floor = id_next(f['last-delivered-id'])
      if lag then g_held = lag end
    end
    if not g_held then g_held = count_range(key, g_floor, '+', max_len + 1) end
    if floor == nil or id_lt(g_floor, floor) then floor = g_floor end
    if g_held > held then held = g_held end
  end
  if held <= max_len then return redis.call('XTRIM', key, 'MAXLEN', '~', max_len) end
  return redis.call('XTRIM', key, 'MINID', '~', floor)
end
-- Record node `me`'s source health in the job's health hash and list the able nodes: the body of
-- report_health (see there for the fields), which the acquire script also runs when a standby's
-- campaign carries its report. age_ms / failing_ms: '' when never answered / not failing.
local function record_health(key, me, age_ms, window_ms, failing_ms, forget_ms)
  local now = now_ms()
  if age_ms ~= '' then redis.call('HSET', key, me, now - tonumber(age_ms)) end
  if failing_ms ~= '' then
    redis.call('HSET', key, 'failing:' .. me, now - tonumber(failing_ms))
  else
    redis.call('HDEL', key, 'failing:' .. me)
  end
  local all = redis.call('HGETALL', key)
  local failing, success = {}, {}
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 8) == 'failing:' then
      failing[string.sub(all[i], 9)] = tonumber(all[i + 1])
    else
      success[all[i]] = tonumber(all[i + 1])
    end
  end
  local forget_before = now - tonumber(forget_ms)
  for node, since in pairs(failing) do
    local last = success[node] or since
    if node ~= me and last < forget_before then
      redis.call('HDEL', key, node, 'failing:' .. node)
      success[node] = nil
    end
  end
  for node, ms in pairs(success) do
    if node ~= me and ms < forget_before then redis.call('HDEL', key, node) end
  end
  local out = {}
  for i = 1, #all, 2 do
    local node = all[i]
    if string.sub(node, 1, 8) ~= 'failing:' and not failing[node]
        and now - tonumber(all[i + 1]) <= tonumber(window_ms) then
      table.insert(out, node)
    end
  end
  return out
end
