-- Shared by every transition script (prepended at load time, after _record.lua); mirrors
-- core/rules.py.

-- The last two ARGV of every transition: a pinned clock ('' in production: Redis TIME is the
-- store's clock; tests pin it to compare with the Python rules) and the Level 3 flag.
local PINNED = tonumber(ARGV[#ARGV - 1])

local function clock()
  if PINNED then return PINNED end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- JSON with every number at full double precision: cjson keeps only 14 significant digits,
-- which rounds a store-clock time to 0.1 ms and made Redis records differ from the rules'.
local function encode(v)
  local kind = type(v)
  if v == NULL or v == nil then return 'null' end
  if kind == 'number' then
    if v ~= v then return 'NaN' end
    if v == math.huge then return 'Infinity' end
    if v == -math.huge then return '-Infinity' end
    if v == math.floor(v) and math.abs(v) < 2^53 then return string.format('%d', v) end
    return string.format('%.17g', v)
  end
  if kind == 'boolean' then return tostring(v) end
  if kind == 'table' then  -- records, probes and answers are all objects
    local parts = {}
    for k, item in pairs(v) do parts[#parts + 1] = cjson.encode(tostring(k)) .. ':' .. encode(item) end
    return '{' .. table.concat(parts, ',') .. '}'
  end
  return cjson.encode(v)
end

-- Whether the key held a record when the script began: a read (inspect) or a sweep of a
-- missing record writes nothing, so no record is left behind without a registry entry.
local STORED = false

local function load(key)
  local raw = redis.call('GET', key)
  STORED = raw ~= false
  return decode(raw)
end

local function bump(rec, state, now, trigger)
  rec.state = state
  rec.version = rec.version + 1
  rec.probes = {}
  rec.successes = 0
  rec.trigger = trigger
  rec.updated_at = now
  if state == 'closed' then rec.opens = 0 end  -- any close resets the backoff
end

-- mirrors rules.open_duration / next_open: the k-th consecutive automatic open lasts
-- min(rt * factor^(k-1), cap); k counts opens and stops growing once the cap is reached.
local function open_duration(k, rt, factor, cap)
  if k <= 1 or factor == 1 then return math.min(rt, cap) end
  return math.min(rt * factor ^ (k - 1), cap)
end

local function open_for(rec, now, trigger, rt, factor, cap)
  bump(rec, 'open', now, trigger)
  local k = rec.opens
  if k < 1 or open_duration(k, rt, factor, cap) < cap then
    k = k + 1
  end
  rec.opens = k
  rec.opened_at = now
  rec.open_until = now + open_duration(k, rt, factor, cap)
end

local function clear_force(rec)
  rec.forced = NULL
  rec.force_expires_at = NULL
  rec.force_reason = ''
  rec.force_actor = NULL
end

-- The last ARGV of every transition says whether Level 3 holds: no automatic step.
local FROZEN = ARGV[#ARGV] == '1'

local function normalise(rec, now)
  local lapsed = NULL
  if not isnull(rec.forced) and not isnull(rec.force_expires_at) and now >= rec.force_expires_at then
    lapsed = rec.forced
    clear_force(rec)
    if lapsed == 'open' and not FROZEN then
      bump(rec, 'half_open', now, 'force_lapsed')
    else
      rec.version = rec.version + 1  -- even when the state stays: workers holding the force adopt its end
      if lapsed == 'open' then  -- held OPEN until the level drops, then due for a probe
        rec.open_until = now
      end
      rec.updated_at = now
    end
  end
  local live = {}
  for token, untl in pairs(rec.probes) do
    if type(untl) == 'number' and untl > now then live[token] = untl end
  end
  rec.probes = live
  return lapsed
end

local function sweep(rec, now)
  if FROZEN then return false end
  if rec.state == 'open' and isnull(rec.forced) and not isnull(rec.open_until) and now >= rec.open_until then
    bump(rec, 'half_open', now, 'recovery_timeout')
    return true
  end
  return false
end

local function count(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n
end

-- The answer, without writing the record.
local function reply(rec, now, result, lapsed, before)
  return '{"record":' .. encode(rec) .. ',"now":' .. encode(now) .. ',"result":' .. encode(result)
    .. ',"lapsed":' .. encode(lapsed) .. ',"moved":' .. tostring(rec.state ~= before) .. '}'
end

-- ARGV[#ARGV - 2]: how long an idle record lives, in ms ('' = for ever). A CLOSED, unforced
-- record expires that long after its last write; any other record never expires. A leading
-- '~' marks a fleet job's read: it keeps the time left and never creates a record.
local TTL_ARG = ARGV[#ARGV - 2] or ''
local KEEP = string.sub(TTL_ARG, 1, 1) == '~'
local RECORD_TTL = tonumber(KEEP and string.sub(TTL_ARG, 2) or TTL_ARG)

local function store(key, rec, text)
  if not RECORD_TTL or RECORD_TTL <= 0 then
    redis.call('SET', key, text)
    return
  end
  local idle = rec.state == 'closed' and isnull(rec.forced)
  local ttl = math.floor(RECORD_TTL)
  if KEEP then
    local left = redis.call('PTTL', key)
    if left == -2 then return end  -- a read of a missing record writes nothing
    if left > 0 then ttl = left end
  end
  if idle then
    redis.call('SET', key, text, 'PX', ttl)
  else
    redis.call('SET', key, text)  -- OPEN, half-open or forced: kept until it closes again
  end
end

-- Write the record (with its idle lifetime) and answer.
local function finish(key, rec, now, result, lapsed, before)
  store(key, rec, encode(rec))
  return reply(rec, now, result, lapsed, before)
end

local key = KEYS[1]
local now = clock()
local rec = load(key)
local before = rec.state
local lapsed = normalise(rec, now)
