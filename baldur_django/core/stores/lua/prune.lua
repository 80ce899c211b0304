-- KEYS[1]: a record key. Delete it only when the record, read as the transition scripts read
-- it (_record.lua is prepended), is CLOSED and unforced; 1 when deleted (or missing).
local raw = redis.call('GET', KEYS[1])
if not raw then return 1 end
local rec = decode(raw)
if rec.state == 'closed' and isnull(rec.forced) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
