-- ARGV: mode (open|closed), ttl_seconds, reason, actor ('' = none, else '=' followed by the actor).
local mode, ttl = ARGV[1], tonumber(ARGV[2])
local target = 'closed'
if mode == 'open' then target = 'open' end
if rec.state ~= target then
  bump(rec, target, now, 'forced')
  if target == 'open' then
    rec.opened_at = now
    rec.open_until = now + ttl
  else
    rec.opened_at = NULL
    rec.open_until = NULL
  end
else
  rec.version = rec.version + 1
  rec.probes = {}
  rec.successes = 0
  rec.updated_at = now
end
rec.forced = mode
rec.force_expires_at = now + ttl
rec.force_reason = ARGV[3]
if ARGV[4] == '' then rec.force_actor = NULL else rec.force_actor = string.sub(ARGV[4], 2) end  -- '=' + actor
return finish(key, rec, now, NULL, lapsed, before)
