"""Lua scripts of ``RedisStore``: each runs atomically in one round trip, on ONE slot.

Every script is given every key it touches (``KEYS``), and all of them share one hash tag,
so each runs on a Redis Cluster as on one Redis: the session scripts touch one session's
keys (``{sid}``), the ledger scripts one principal's ledger (``{ph}``), the tenant scripts
one principal's counters. Work that spans both (a commit under a quota) is two scripts
that ``RedisStore`` runs one after the other; what that changes is said in ``redis.py``.

Ids in the journal stream are ``<seq>-0``; ``XTRIM MINID <seq>-1`` therefore
drops every entry up to and including ``seq``. Numbers written back to Redis go
through ``string.format('%d')`` so large values never turn into ``1e+15``.
"""

# --- one session's keys: KEYS are the session's own, in its {sid} slot ---------------------

# The bytes the ledger counts for a session: snapshot + item records + journal payload.
_SIZE = """
local function session_size(snap, meta)
  local m = redis.call('HMGET', meta, 'ibytes', 'bytes')
  return redis.call('STRLEN', snap) + (tonumber(m[1]) or 0) + (tonumber(m[2]) or 0)
end
"""

# KEYS: 1 fence, 2 snap, 3 log, 4 meta, 5 items
# ARGV: 1 fence, 2 idle_ttl_ms, 3 max_events, 4 max_bytes, 5 lost_through,
#       6 has_snapshot ('1' | '0'), 7 snapshot, 8 n_items, 9 n_drops, 10 report ('1': a quota's
#       ledger wants the size), then n_items (id, data) pairs, n_drops ids, then (seq, data) pairs.
# Returns {1, '', size, ver} when written (size and ver: with report, else 0), {0,
# current_fence_or_''} when fenced (nothing written). meta's ``ver`` counts the writes that
# reported a size, so the ledger keeps the newest of two reports that cross (``fence``, ``ver``).
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
local at = 11
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
local first_event = 11 + 2 * n_items + n_drops
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
local size, ver = 0, 0
if ARGV[10] == '1' then
  ver = redis.call('HINCRBY', KEYS[4], 'ver', 1)
  size = session_size(KEYS[2], KEYS[4])
end
for i = 1, 5 do
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return {1, '', size, ver}
"""

# KEYS: 1 fence, 2 log, 3 meta, 4 snap, 5 items
# ARGV: 1 up_to_seq, 2 idle_ttl_ms, 3 report ('1': the ledger wants the size)
# Returns {entries dropped, size (-1: no session, or no report), fence, ver}.
_TRIM = """
local fence = redis.call('GET', KEYS[1])
if not fence then
  return {0, -1, 0, 0}
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
local size, ver = -1, 0
if ARGV[3] == '1' then
  ver = redis.call('HINCRBY', KEYS[3], 'ver', 1)
  size = session_size(KEYS[4], KEYS[3])
end
for i = 1, 3 do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return {#old, size, fence, ver}
"""

# KEYS: 1 fence, 2 lease, 3 snap, 4 log, 5 meta, 6 items
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
for i = 3, 6 do
  redis.call('PEXPIRE', KEYS[i], ARGV[3])
end
return f
"""

# KEYS: 1 fence, 2 lease, 3 snap, 4 log, 5 meta, 6 items
# ARGV: 1 owner, 2 fence, 3 lease_ttl_ms, 4 idle_ttl_ms. Returns 1, or 0 if fenced.
RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'fence', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
for i = 3, 6 do
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

# KEYS: 1 fence, 2 lease, 3 snap, 4 log, 5 meta, 6 items. Deletes them all unless a replica
# holds the lease (it resumed the session after the ledger chose to forget it): 1 if deleted.
FORGET = """
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
return 1
"""

# KEYS: 1 meta, 2 log; ARGV: 1 after_seq, 2 limit (0: none). One consistent view:
# {last ('' : no journal), trimmed, entries after after_seq, id of the first entry ('' : none)}.
READ_EVENTS = """
local m = redis.call('HMGET', KEYS[1], 'last', 'trimmed')
if not m[1] then
  return {'', '0', {}, ''}
end
local entries
if tonumber(ARGV[2]) > 0 then
  entries = redis.call('XRANGE', KEYS[2], '(' .. ARGV[1] .. '-0', '+', 'COUNT', ARGV[2])
else
  entries = redis.call('XRANGE', KEYS[2], '(' .. ARGV[1] .. '-0', '+')
end
local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
return {m[1], m[2] or '0', entries, first[1] and first[1][1] or ''}
"""

# KEYS: 1 snap, 2 items. One consistent view: {snapshot (nil: none), flat item id/record list}.
LOAD_SESSION = """
return {redis.call('GET', KEYS[1]), redis.call('HGETALL', KEYS[2])}
"""

# KEYS: every key to delete (one session's). Returns 1.
DELETE = """
redis.call('DEL', unpack(KEYS))
return 1
"""

# --- the ledger of a principal's session state: KEYS in its {ph} slot ------------------------
# L_STATE (zset: session id -> when its state expires, ms), L_HELD (hash: session id -> bytes,
# and '_total'), L_LEASED (zset: session id -> when its lease lapses, ms), L_ORDER (hash:
# session id -> 'fence:ver' of the write its size came from). A session in L_STATE but not in
# L_LEASED is *kept*: no replica serves it. Forgetting a session drops it here and returns
# its id: ``RedisStore`` then deletes its keys (FORGET, in the session's own slot).
LEDGER = """
local L_STATE, L_HELD, L_LEASED, L_ORDER = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function ledger_drop(sid)
  local b = tonumber(redis.call('HGET', L_HELD, sid) or '0')
  if redis.call('HDEL', L_HELD, sid) == 1 then redis.call('HINCRBY', L_HELD, '_total', -b) end
  redis.call('ZREM', L_STATE, sid)
  redis.call('ZREM', L_LEASED, sid)
  redis.call('HDEL', L_ORDER, sid)
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
-- True (and remembered) when the write (fence, ver) is newer than the one the ledger has.
local function newer(sid, fence, ver)
  local o = redis.call('HGET', L_ORDER, sid)
  if o then
    local f, v = string.match(o, '^(%d+):(%d+)$')
    f, v = tonumber(f), tonumber(v)
    if f and (f > fence or (f == fence and v >= ver)) then return false end
  end
  redis.call('HSET', L_ORDER, sid, string.format('%d:%d', fence, ver))
  return true
end
local function ledger_ttl(ms)
  for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ms) end
end
-- Forget kept sessions, least recently served first (lowest expiry), while more than max_kept
-- are kept or more than max_bytes - room are held (0: no limit); never one in keep (a set).
-- Returns the ids forgotten.
local function forget_kept(max_bytes, max_kept, room, keep)
  local gone = {}
  local kept = redis.call('ZCARD', L_STATE) - redis.call('ZCARD', L_LEASED)
  local function over()
    return kept > 0 and ((max_kept > 0 and kept > max_kept) or (max_bytes > 0 and ledger_total() > max_bytes - room))
  end
  local skipped = 0
  while over() do
    local batch = redis.call('ZRANGE', L_STATE, skipped, skipped + 31)
    if #batch == 0 then return gone end
    for _, sid in ipairs(batch) do
      if not keep[sid] and not redis.call('ZSCORE', L_LEASED, sid) then
        ledger_drop(sid)
        gone[#gone + 1] = sid
        kept = kept - 1
        if not over() then return gone end
      else
        skipped = skipped + 1
      end
    end
  end
  return gone
end
"""

# The ledger's KEYS, in every script below: 1 state, 2 held, 3 leased, 4 order.

# Sizes of sessions just written (COMMIT, TRIM report them).
# ARGV: 1 ledger ttl ms, 2 quota max_bytes (0: forget nothing), then per session 5 values:
#       id, size, fence, ver, idle_ttl_ms. Returns the ids forgotten (to delete).
_LEDGER_SET = """
local now = now_ms()
ledger_expire(now)
local keep = {}
for i = 3, #ARGV, 5 do
  local sid = ARGV[i]
  keep[sid] = true
  if newer(sid, tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])) then
    ledger_set(sid, tonumber(ARGV[i + 1]), now + tonumber(ARGV[i + 4]))
  end
end
local gone = {}
local max_bytes = tonumber(ARGV[2])
if max_bytes > 0 and ledger_total() > max_bytes then
  gone = forget_kept(max_bytes, 0, 0, keep)
end
ledger_ttl(ARGV[1])
return gone
"""

# A session acquired (opened or resumed): counted as served. With ``new`` it is admitted
# first: kept sessions are forgotten while max_bytes or more are held, then refused if still.
# ARGV: 1 session id, 2 lease_ttl_ms, 3 idle_ttl_ms, 4 ledger ttl ms, 5 quota max_bytes, 6 new.
# Returns {1, 0, forgotten ids} or, refused, {0, bytes held, forgotten ids}.
_LEDGER_ACQUIRE = """
local now = now_ms()
ledger_expire(now)
local gone = {}
local max_bytes = tonumber(ARGV[5])
if ARGV[6] == '1' and max_bytes > 0 then
  gone = forget_kept(max_bytes, 0, 1, {[ARGV[1]] = true})
  if ledger_total() >= max_bytes then
    return {0, ledger_total(), gone}
  end
end
local size = tonumber(redis.call('HGET', L_HELD, ARGV[1]) or '0')
ledger_set(ARGV[1], size, now + tonumber(ARGV[3]))
redis.call('ZADD', L_LEASED, now + tonumber(ARGV[2]), ARGV[1])
ledger_ttl(ARGV[4])
return {1, 0, gone}
"""

# Leases renewed. ARGV: 1 lease_ttl_ms, 2 ledger ttl ms, then (session id, idle_ttl_ms) pairs.
_LEDGER_RENEW = """
local now = now_ms()
for i = 3, #ARGV, 2 do
  redis.call('HSETNX', L_HELD, ARGV[i], '0')
  redis.call('ZADD', L_STATE, now + tonumber(ARGV[i + 1]), ARGV[i])
  redis.call('ZADD', L_LEASED, now + tonumber(ARGV[1]), ARGV[i])
end
ledger_ttl(ARGV[2])
return 1
"""

# A session released: now kept; the oldest kept beyond the quota are forgotten.
# ARGV: 1 session id, 2 quota max_bytes, 3 quota max_kept. Returns the ids forgotten.
_LEDGER_RELEASE = """
redis.call('ZREM', L_LEASED, ARGV[1])
ledger_expire(now_ms())
return forget_kept(tonumber(ARGV[2]), tonumber(ARGV[3]), 0, {})
"""

# A session deleted. ARGV: 1 session id.
_LEDGER_DROP = """
ledger_drop(ARGV[1])
return 1
"""

# Returns {bytes, sessions, kept}.
_STATE_HELD = """
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

# The scripts that share helpers start with them.
COMMIT = _SIZE + _COMMIT
TRIM = _SIZE + _TRIM
LEDGER_SET = LEDGER + _LEDGER_SET
LEDGER_ACQUIRE = LEDGER + _LEDGER_ACQUIRE
LEDGER_RENEW = LEDGER + _LEDGER_RENEW
LEDGER_RELEASE = LEDGER + _LEDGER_RELEASE
LEDGER_DROP = LEDGER + _LEDGER_DROP
STATE_HELD = LEDGER + _STATE_HELD


# The store's epoch (``RedisStore.probe``): KEYS[1] = P epoch; ARGV[1] = a new random id.
# Returns the id kept there, setting ARGV[1] first when there is none (a Redis that came
# back empty): every replica then sees an id other than the one it knew.
EPOCH = """
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""
