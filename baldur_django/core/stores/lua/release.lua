-- Remove a force: forced open -> HALF_OPEN, forced closed -> automatic CLOSED with its counts.
local previous = rec.forced
if not isnull(previous) then
  clear_force(rec)
  if previous == 'open' then
    bump(rec, 'half_open', now, 'released')
  else  -- still CLOSED, but a new version: workers holding the force must see it end
    rec.version = rec.version + 1
    rec.updated_at = now
  end
end
return finish(key, rec, now, previous, lapsed, before)
