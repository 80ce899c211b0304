-- Reading a stored record, shared by the transition scripts (through the prelude) and prune.lua;
-- the same rule as decode() in core/stores/base.py. A missing or corrupt record reads as a fresh
-- CLOSED one. Corrupt: not JSON, not an object, no state or version, or a field of the
-- wrong type or with an impossible value. A field that is absent or null takes its default;
-- unknown fields are dropped.
local NULL = cjson.null
local function isnull(v) return v == nil or v == NULL end

local function fresh()
  return {state = 'closed', version = 0, opened_at = NULL, open_until = NULL, trigger = NULL,
          forced = NULL, force_expires_at = NULL, force_reason = '', force_actor = NULL,
          probes = {}, successes = 0, updated_at = NULL, opens = 0}
end

local MAX_COUNT = 2^53 - 1  -- the largest whole number a double holds exactly

local function count_ok(v)  -- a version or count: a whole number from 0 to 2^53 - 1 (not NaN)
  return type(v) == 'number' and v == math.floor(v) and v >= 0 and v <= MAX_COUNT
end

local function time_ok(v) return type(v) == 'number' end
local function text_ok(v) return type(v) == 'string' end
local function state_ok(v) return v == 'closed' or v == 'open' or v == 'half_open' end
local function forced_ok(v) return v == 'open' or v == 'closed' end

-- token -> lease expiry: string keys, number values (a JSON array has number keys; an empty
-- one cannot be told from {} and counts as no probes, as in decode())
local function probes_ok(v)
  if type(v) ~= 'table' then return false end
  for token, untl in pairs(v) do
    if type(token) ~= 'string' or type(untl) ~= 'number' then return false end
  end
  return true
end

local CHECKS = {state = state_ok, version = count_ok, opened_at = time_ok, open_until = time_ok,
                trigger = text_ok, forced = forced_ok, force_expires_at = time_ok,
                force_reason = text_ok, force_actor = text_ok, probes = probes_ok,
                successes = count_ok, updated_at = time_ok, opens = count_ok}

local function decode(raw)
  if not raw then return fresh() end
  local ok, data = pcall(cjson.decode, raw)
  if not ok or type(data) ~= 'table' then return fresh() end
  if isnull(data.state) or isnull(data.version) then return fresh() end
  local rec = fresh()
  for name, check in pairs(CHECKS) do
    local v = data[name]
    if not isnull(v) then
      if not check(v) then return fresh() end
      rec[name] = v
    end
  end
  return rec
end
