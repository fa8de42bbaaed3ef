"""Lua scripts of ``RedisStore``: each runs atomically in one round trip.

Ids in the journal stream are ``<seq>-0``; ``XTRIM MINID <seq>-1`` therefore
drops every entry up to and including ``seq``. Numbers written back to Redis go
through ``string.format('%d')`` so large values never turn into ``1e+15``.
"""

# --- the ledger of a principal's session state ------------------------------------------
# Prepended to the scripts that keep it. L_STATE (zset: session id -> when its state expires,
# ms), L_HELD (hash: session id -> bytes, and '_total'), L_LEASED (zset: session id -> when its
# lease lapses, ms). A session in L_STATE but not in L_LEASED is *kept*: no replica serves it.
# ``forget`` deletes a kept session's keys by name, built from the key prefix: keys a script
# was not given, which plain Redis allows and Redis Cluster would not (the client speaks plain
# Redis; a Cluster port would forget them in a second call, after the ledger says which).
LEDGER = """
local L_STATE, L_HELD, L_LEASED
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function ledger_drop(sid)
  local b = tonumber(redis.call('HGET', L_HELD, sid) or '0')
  if redis.call('HDEL', L_HELD, sid) == 1 then redis.call('HINCRBY', L_HELD, '_total', -b) end
  redis.call('ZREM', L_STATE, sid)
  redis.call('ZREM', L_LEASED, sid)
end
local function ledger_expire(now)
  for _, sid in ipairs(redis.call('ZRANGEBYSCORE', L_STATE, '-inf', now, 'LIMIT', 0, 64)) do
    ledger_drop(sid)
  end
  redis.call('ZREMRANGEBYSCORE', L_LEASED, '-inf', now)
end
local function ledger_total()
  return tonumber(redis.call('HGET', L_HELD, '_total') or '0')
end
local function ledger_set(sid, size, expires_at)
  local old = tonumber(redis.call('HGET', L_HELD, sid) or '0')
  redis.call('HSET', L_HELD, sid, string.format('%d', size))
  redis.call('HINCRBY', L_HELD, '_total', size - old)
  redis.call('ZADD', L_STATE, expires_at, sid)
end
local function ledger_ttl(ms)
  redis.call('PEXPIRE', L_STATE, ms)
  redis.call('PEXPIRE', L_HELD, ms)
  redis.call('PEXPIRE', L_LEASED, ms)
end
local function forget(prefix, sid)
  local base = prefix .. 's:{' .. sid .. '}:'
  redis.call('DEL', base .. 'snap', base .. 'log', base .. 'meta', base .. 'items', base .. 'fence',
             base .. 'lease')
  ledger_drop(sid)
end
-- Forget kept sessions, least recently served first (lowest expiry), while more than max_kept
-- are kept or more than max_bytes - room are held (0: no limit); never the session keep.
local function forget_kept(prefix, max_bytes, max_kept, room, keep)
  local kept = redis.call('ZCARD', L_STATE) - redis.call('ZCARD', L_LEASED)
  local function over()
    return kept > 0 and ((max_kept > 0 and kept > max_kept) or (max_bytes > 0 and ledger_total() > max_bytes - room))
  end
  local skipped = 0
  while over() do
    local batch = redis.call('ZRANGE', L_STATE, skipped, skipped + 31)
    if #batch == 0 then return end
    for _, sid in ipairs(batch) do
      if sid ~= keep and not redis.call('ZSCORE', L_LEASED, sid) then
        forget(prefix, sid)
        kept = kept - 1
        if not over() then return end
      else
        skipped = skipped + 1
      end
    end
  end
end
local function session_size(snap, items_meta, meta)
  local m = redis.call('HMGET', meta, 'ibytes', 'bytes')
  return redis.call('STRLEN', snap) + (tonumber(m[1]) or 0) + (tonumber(m[2]) or 0)
end
"""

# KEYS: 1 fence, 2 snap, 3 log, 4 meta, 5 items; with a quota also 6-8 the ledger
#       (state, held, leased)
# ARGV: 1 fence, 2 idle_ttl_ms, 3 max_events, 4 max_bytes, 5 lost_through,
#       6 has_snapshot ('1' | '0'), 7 snapshot, 8 n_items, 9 n_drops,
#       10 session id, 11 key prefix, 12 quota max_bytes, 13 ledger ttl ms,
#       then n_items (id, data) pairs, n_drops ids, then (seq, data) pairs.
# Returns {1, ''} when written, {0, current_fence_or_''} when fenced (nothing written).
# meta's ``ibytes``: the item records' bytes (what the ledger counts with snapshot and journal).
_COMMIT = """
local cur = redis.call('GET', KEYS[1])
if cur ~= ARGV[1] then
  return {0, cur or ''}
end
local ttl = ARGV[2]
if ARGV[6] == '1' then
  redis.call('SET', KEYS[2], ARGV[7], 'PX', ttl)
end
local n_items, n_drops = tonumber(ARGV[8]), tonumber(ARGV[9])
local at = 14
local ibytes = tonumber(redis.call('HGET', KEYS[4], 'ibytes') or '0')
for i = 1, n_drops do
  local id = ARGV[at + 2 * n_items + i - 1]
  ibytes = ibytes - redis.call('HSTRLEN', KEYS[5], id)
  redis.call('HDEL', KEYS[5], id)
end
for i = 1, n_items do
  ibytes = ibytes + #ARGV[at + 1] - redis.call('HSTRLEN', KEYS[5], ARGV[at])
  redis.call('HSET', KEYS[5], ARGV[at], ARGV[at + 1])
  at = at + 2
end
if n_items > 0 or n_drops > 0 then
  redis.call('HSET', KEYS[4], 'ibytes', string.format('%d', ibytes))
end
local first_event = 14 + 2 * n_items + n_drops
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
if #KEYS > 5 then
  L_STATE, L_HELD, L_LEASED = KEYS[6], KEYS[7], KEYS[8]
  local now = now_ms()
  ledger_expire(now)
  ledger_set(ARGV[10], session_size(KEYS[2], KEYS[5], KEYS[4]), now + tonumber(ttl))
  local max_bytes = tonumber(ARGV[12])
  if max_bytes > 0 and ledger_total() > max_bytes then
    forget_kept(ARGV[11], max_bytes, 0, 0, ARGV[10])
  end
  ledger_ttl(ARGV[13])
end
return {1, ''}
"""

# KEYS: 1 fence, 2 log, 3 meta; with a quota also 4 snap, 5 items, 6-8 the ledger
# ARGV: 1 up_to_seq, 2 idle_ttl_ms, 3 session id, 4 ledger ttl ms. Returns entries dropped.
_TRIM = """
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
if #KEYS > 3 then
  L_STATE, L_HELD, L_LEASED = KEYS[6], KEYS[7], KEYS[8]
  local now = now_ms()
  ledger_expire(now)
  ledger_set(ARGV[3], session_size(KEYS[4], KEYS[5], KEYS[3]), now + tonumber(ARGV[2]))
  ledger_ttl(ARGV[4])
end
return #old
"""

# KEYS: 1 fence, 2 lease, 3 snap, 4 log, 5 meta, 6 items; with a quota also 7-9 the ledger
# ARGV: 1 owner, 2 lease_ttl_ms, 3 idle_ttl_ms; with a quota 4 session id, 5 key prefix,
#       6 quota max_bytes, 7 ledger ttl ms, 8 new ('1': admit it first).
# Returns {1, the new fence}, or {0, bytes held} when a new session is refused (max_bytes).
# A new counter starts at the server's clock in ms, so a token issued after the
# counter expired (idle TTL) is still above every token issued before it.
_ACQUIRE = """
local now
if #KEYS > 6 then
  L_STATE, L_HELD, L_LEASED = KEYS[7], KEYS[8], KEYS[9]
  now = now_ms()
  ledger_expire(now)
  local max_bytes = tonumber(ARGV[6])
  if ARGV[8] == '1' and max_bytes > 0 then
    forget_kept(ARGV[5], max_bytes, 0, 1, ARGV[4])
    if ledger_total() >= max_bytes then
      return {0, ledger_total()}
    end
  end
end
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
for i = 3, 6 do
  redis.call('PEXPIRE', KEYS[i], ARGV[3])
end
if #KEYS > 6 then
  local size = tonumber(redis.call('HGET', L_HELD, ARGV[4]) or '0')
  ledger_set(ARGV[4], size, now + tonumber(ARGV[3]))
  redis.call('ZADD', L_LEASED, now + tonumber(ARGV[2]), ARGV[4])
  ledger_ttl(ARGV[7])
end
return {1, f}
"""

# KEYS: 1 fence, 2 lease, 3 snap, 4 log, 5 meta, 6 items; with a quota also 7-9 the ledger
# ARGV: 1 owner, 2 fence, 3 lease_ttl_ms, 4 idle_ttl_ms; with a quota 5 session id, 6 ledger ttl ms.
# Returns 1, or 0 if fenced.
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'fence', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
for i = 3, 6 do
  redis.call('PEXPIRE', KEYS[i], ARGV[4])
end
if #KEYS > 6 then
  L_STATE, L_HELD, L_LEASED = KEYS[7], KEYS[8], KEYS[9]
  local now = now_ms()
  redis.call('HSETNX', L_HELD, ARGV[5], '0')
  redis.call('ZADD', L_STATE, now + tonumber(ARGV[4]), ARGV[5])
  redis.call('ZADD', L_LEASED, now + tonumber(ARGV[3]), ARGV[5])
  ledger_ttl(ARGV[6])
end
return 1
"""

# KEYS: 1 fence, 2 lease; with a quota also 3-5 the ledger
# ARGV: 1 fence; with a quota 2 session id, 3 key prefix, 4 quota max_bytes, 5 quota max_kept.
# Returns 1, or 0 if fenced. The session is now kept: the oldest kept beyond the quota go.
_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
if #KEYS > 2 then
  L_STATE, L_HELD, L_LEASED = KEYS[3], KEYS[4], KEYS[5]
  redis.call('ZREM', L_LEASED, ARGV[2])
  ledger_expire(now_ms())
  forget_kept(ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), 0, nil)
end
return 1
"""

# KEYS: the session's keys, then 3 ledger keys (state, held, leased); ARGV: 1 session id.
_DELETE = """
L_STATE, L_HELD, L_LEASED = KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS]
for i = 1, #KEYS - 3 do
  redis.call('DEL', KEYS[i])
end
ledger_drop(ARGV[1])
return 1
"""

# KEYS: the ledger (state, held, leased). Returns {bytes, sessions, kept}.
_STATE_HELD = """
L_STATE, L_HELD, L_LEASED = KEYS[1], KEYS[2], KEYS[3]
ledger_expire(now_ms())
local sessions = redis.call('ZCARD', L_STATE)
return {ledger_total(), sessions, sessions - redis.call('ZCARD', L_LEASED)}
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

# The scripts that keep a ledger start with its helpers.
COMMIT = LEDGER + _COMMIT
TRIM = LEDGER + _TRIM
ACQUIRE = LEDGER + _ACQUIRE
RENEW = LEDGER + _RENEW
RELEASE = LEDGER + _RELEASE
DELETE = LEDGER + _DELETE
STATE_HELD = LEDGER + _STATE_HELD
