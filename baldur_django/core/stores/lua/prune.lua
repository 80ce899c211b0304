-- KEYS[1]: a record key. Delete it only when it is CLOSED and unforced; 1 when deleted.
local raw = redis.call('GET', KEYS[1])
if not raw then return 1 end
local ok, rec = pcall(cjson.decode, raw)
if not ok or type(rec) ~= 'table' then
  redis.call('DEL', KEYS[1])
  return 1
end
if rec.state == 'closed' and (rec.forced == nil or rec.forced == cjson.null) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
