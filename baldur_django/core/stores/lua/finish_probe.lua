-- ARGV: token, version, outcome (success|failure|slow|abandon), max_calls, recovery_timeout, backoff factor, cap.
local token, outcome = ARGV[1], ARGV[3]
if FROZEN then outcome = 'abandon' end  -- the slot goes back, nothing is decided
local result = NULL
if rec.version == tonumber(ARGV[2]) and rec.state == 'half_open' and rec.probes[token] ~= nil then
  rec.probes[token] = nil
  rec.updated_at = now
  if outcome == 'success' then
    rec.successes = rec.successes + 1
    if rec.successes >= tonumber(ARGV[4]) then
      bump(rec, 'closed', now, 'half_open_success')
      rec.opened_at = NULL
      rec.open_until = NULL
      result = 'closed'
    end
  elseif outcome == 'failure' or outcome == 'slow' then
    local trigger = 'half_open_failure'
    if outcome == 'slow' then trigger = 'slow_call_rate' end
    open_for(rec, now, trigger, tonumber(ARGV[5]), tonumber(ARGV[6]) or 1, tonumber(ARGV[7]) or math.huge)
    result = 'open'
  end
end
return finish(key, rec, now, result, lapsed, before)
