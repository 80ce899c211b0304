-- ARGV: trigger, recovery_timeout (seconds). CLOSED (unforced) -> OPEN; a force refuses (OP-4).
local result
if not isnull(rec.forced) then
  result = 'blocked'
elseif rec.state ~= 'closed' then
  result = 'already'
else
  bump(rec, 'open', now, ARGV[1])
  rec.opened_at = now
  rec.open_until = now + tonumber(ARGV[2])
  result = 'tripped'
end
return finish(key, rec, now, result, lapsed, before)
