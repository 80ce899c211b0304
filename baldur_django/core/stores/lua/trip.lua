-- ARGV: trigger, recovery_timeout (seconds), backoff factor, timeout cap (seconds). CLOSED (unforced) -> OPEN; a force refuses.
local result
if FROZEN then
  result = 'already'  -- Level 3 holds every trip, forced or not (as the rules decide it: no trip_blocked)
elseif not isnull(rec.forced) then
  result = 'blocked'
elseif rec.state ~= 'closed' then
  result = 'already'
else
  open_for(rec, now, ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]) or 1, tonumber(ARGV[4]) or math.huge)
  result = 'tripped'
end
return finish(key, rec, now, result, lapsed, before)
