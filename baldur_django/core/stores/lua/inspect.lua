-- A fleet task's read: as load.lua, but a missing record stays missing (nothing is written).
if not STORED then return reply(rec, now, NULL, lapsed, before) end
return finish(key, rec, now, NULL, lapsed, before)
