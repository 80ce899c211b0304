-- ARGV: token, max_calls, lease_seconds. OPEN past its timeout -> HALF_OPEN; admit when a slot is free.
sweep(rec, now)
local admitted = false
if not FROZEN and rec.state == 'half_open' and isnull(rec.forced) and count(rec.probes) + rec.successes < tonumber(ARGV[2]) then
  rec.probes[ARGV[1]] = now + tonumber(ARGV[3])
  rec.updated_at = now
  admitted = true
end
return finish(key, rec, now, admitted, lapsed, before)
