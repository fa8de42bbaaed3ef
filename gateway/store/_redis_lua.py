"""Lua scripts of ``RedisStore``: each runs atomically in one round trip.

Ids in the journal stream are ``<seq>-0``; ``XTRIM MINID <seq>-1`` therefore
drops every entry up to and including ``seq``. Numbers written back to Redis go
through ``string.format('%d')`` so large values never turn into ``1e+15``.
"""

# KEYS: 1 fence, 2 snap, 3 log, 4 meta, 5 items
# ARGV: 1 fence, 2 idle_ttl_ms, 3 max_events, 4 max_bytes, 5 lost_through,
#       6 has_snapshot ('1' | '0'), 7 snapshot, 8 n_items, 9 n_drops,
#       then n_items (id, data) pairs, n_drops ids, then (seq, data) pairs.
# Returns {1, ''} when written, {0, current_fence_or_''} when fenced (nothing written).
COMMIT = """
local cur = redis.call('GET', KEYS[1])
if cur ~= ARGV[1] then
  return {0, cur or ''}
end
local ttl = ARGV[2]
if ARGV[6] == '1' then
  redis.call('SET', KEYS[2], ARGV[7], 'PX', ttl)
end
local n_items, n_drops = tonumber(ARGV[8]), tonumber(ARGV[9])
local at = 10
for i = 1, n_drops do
  redis.call('HDEL', KEYS[5], ARGV[at + 2 * n_items + i - 1])
end
for i = 1, n_items do
  redis.call('HSET', KEYS[5], ARGV[at], ARGV[at + 1])
  at = at + 2
end
local first_event = 10 + 2 * n_items + n_drops
local m = redis.call('HMGET', KEYS[4], 'last', 'trimmed', 'bytes')
local lost = tonumber(ARGV[5])
if m[1] or #ARGV >= first_event or lost > 0 then
  local last = tonumber(m[1]) or 0
  local trimmed = math.max(tonumber(m[2]) or 0, lost)
  local bytes = tonumber(m[3]) or 0
  for i = first_event, #ARGV, 2 do
    local seq = tonumber(ARGV[i])
    if seq > last and seq > trimmed then
      -- pcall: an id at or below the stream's top (meta lost) is skipped, not fatal
      local r = redis.pcall('XADD', KEYS[3], ARGV[i] .. '-0', 'd', ARGV[i + 1])
      if type(r) ~= 'table' or not r.err then
        bytes = bytes + #ARGV[i + 1]
      end
    end
    if seq > last then last = seq end
  end
  -- caps: drop the oldest entries exactly; cut is the id of the last one dropped
  local maxn, maxb = tonumber(ARGV[3]), tonumber(ARGV[4])
  local cut = nil
  local excess = redis.call('XLEN', KEYS[3]) - maxn
  if excess > 0 then
    for _, e in ipairs(redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', excess)) do
      bytes = bytes - #e[2][2]
      cut = e[1]
    end
  end
  while bytes > maxb do
    local batch = redis.call('XRANGE', KEYS[3], cut and ('(' .. cut) or '-', '+', 'COUNT', 128)
    if #batch == 0 then
      bytes = 0
      break
    end
    for _, e in ipairs(batch) do
      bytes = bytes - #e[2][2]
      cut = e[1]
      if bytes <= maxb then break end
    end
  end
  if cut then
    local s = string.match(cut, '^(%d+)')
    redis.call('XTRIM', KEYS[3], 'MINID', s .. '-1')
    trimmed = math.max(trimmed, tonumber(s))
  end
  redis.call('HSET', KEYS[4], 'last', string.format('%d', last),
             'trimmed', string.format('%d', trimmed), 'bytes', string.format('%d', bytes))
end
for i = 1, 5 do
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return {1, ''}
"""

# KEYS: 1 fence, 2 log, 3 meta; ARGV: 1 up_to_seq, 2 idle_ttl_ms. Returns entries dropped.
TRIM = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local m = redis.call('HMGET', KEYS[3], 'last', 'trimmed', 'bytes')
local bytes = tonumber(m[3]) or 0
local old = redis.call('XRANGE', KEYS[2], '-', ARGV[1] .. '-0')
for _, e in ipairs(old) do
  bytes = bytes - #e[2][2]
end
if #old > 0 then
  redis.call('XTRIM', KEYS[2], 'MINID', ARGV[1] .. '-1')
end
local trimmed = math.max(tonumber(m[2]) or 0, tonumber(ARGV[1]))
redis.call('HSET', KEYS[3], 'last', m[1] or '0', 'trimmed', string.format('%d', trimmed),
           'bytes', string.format('%d', bytes))
for i = 1, 3 do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return #old
"""

# KEYS: 1 fence, 2 lease, 3 snap, 4 log, 5 meta
# ARGV: 1 owner, 2 lease_ttl_ms, 3 idle_ttl_ms. Returns the new fence.
# A new counter starts at the server's clock in ms, so a token issued after the
# counter expired (idle TTL) is still above every token issued before it.
ACQUIRE = """
local f
if redis.call('EXISTS', KEYS[1]) == 1 then
  f = redis.call('INCR', KEYS[1])
else
  local t = redis.call('TIME')
  f = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('SET', KEYS[1], string.format('%d', f))
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'fence', string.format('%d', f))
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
for i = 3, 5 do
  redis.call('PEXPIRE', KEYS[i], ARGV[3])
end
return f
"""

# KEYS: 1 fence, 2 lease, 3 snap, 4 log, 5 meta
# ARGV: 1 owner, 2 fence, 3 lease_ttl_ms, 4 idle_ttl_ms. Returns 1, or 0 if fenced.
RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'fence', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
for i = 3, 5 do
  redis.call('PEXPIRE', KEYS[i], ARGV[4])
end
return 1
"""

# KEYS: 1 fence, 2 lease; ARGV: 1 fence. Returns 1, or 0 if fenced.
RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
return 1
"""

# --- tenant limits ---------------------------------------------------------------------
# Times are the server's clock in ms (TIME), so every replica counts on one clock.

# KEYS: 1 open (zset conn_id -> expiry ms), 2 starts (zset conn_id -> start ms)
# ARGV: 1 conn_id, 2 max_open, 3 starts_per_min, 4 ttl_ms
# Returns {ok (1|0), refused limit name or '', open, starts, reset_ms}.
ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max_open, spm, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - 60000)
local open = redis.call('ZCARD', KEYS[1])
local starts = redis.call('ZCARD', KEYS[2])
local function reset()
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if #oldest == 0 then return 0 end
  return tonumber(oldest[2]) + 60000 - now
end
if max_open > 0 and open >= max_open then
  return {0, 'max_sessions', open, starts, reset()}
end
if spm > 0 and starts >= spm then
  return {0, 'session_starts_per_min', open, starts, reset()}
end
if max_open > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  -- only ever extended: entries of different TTLs (client secrets) all outlive the set's expiry
  if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
  open = open + 1
end
if spm > 0 then
  redis.call('ZADD', KEYS[2], now, ARGV[1])
  redis.call('PEXPIRE', KEYS[2], 60000)
  starts = starts + 1
end
return {1, '', open, starts, reset()}
"""

# KEYS: 1 open; ARGV: 1 conn_id, 2 ttl_ms. Returns the open count after dropping expired entries.
REFRESH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return redis.call('ZCARD', KEYS[1])
"""

# KEYS: 1 budget (hash: w = window number, used = units given out in it)
# ARGV: 1 want, 2 limit, 3 window_ms. Returns {granted, used, window, reset_ms}.
TAKE_BUDGET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wms = tonumber(ARGV[3])
local window = math.floor(now / wms)
local m = redis.call('HMGET', KEYS[1], 'w', 'used')
local used = 0
if tonumber(m[1]) == window then used = tonumber(m[2]) or 0 end
local granted = math.max(0, math.min(tonumber(ARGV[1]), tonumber(ARGV[2]) - used))
used = used + granted
redis.call('HSET', KEYS[1], 'w', string.format('%d', window), 'used', string.format('%d', used))
redis.call('PEXPIRE', KEYS[1], 2 * wms)
return {granted, used, window, (window + 1) * wms - now}
"""

# KEYS: 1 budget; ARGV: 1 amount, 2 window. Gives back unused units of a window still current.
RETURN_BUDGET = """
local m = redis.call('HMGET', KEYS[1], 'w', 'used')
if m[1] ~= ARGV[2] then return 0 end
local back = math.min(tonumber(ARGV[1]), tonumber(m[2]) or 0)
redis.call('HINCRBY', KEYS[1], 'used', -back)
return back
"""
