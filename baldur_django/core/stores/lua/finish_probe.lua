-- ARGV: token, version, outcome (success|failure|abandon), max_calls, recovery_timeout.
local token, outcome = ARGV[1], ARGV[3]
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
  elseif outcome == 'failure' then
    bump(rec, 'open', now, 'half_open_failure')
    rec.opened_at = now
    rec.open_until = now + tonumber(ARGV[5])
    result = 'open'
  end
end
return finish(key, rec, now, result, lapsed, before)
