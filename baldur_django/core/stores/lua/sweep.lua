-- Recovery sweep for one record: OPEN (unforced) past its timeout -> HALF_OPEN. A missing
-- record (a fresh CLOSED one) has nothing to sweep and is not written.
local moved = sweep(rec, now)
if not STORED then return reply(rec, now, moved, lapsed, before) end
return finish(key, rec, now, moved, lapsed, before)
