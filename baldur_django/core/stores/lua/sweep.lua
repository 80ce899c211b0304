-- Recovery sweep for one record: OPEN (unforced) past its timeout -> HALF_OPEN.
local moved = sweep(rec, now)
return finish(key, rec, now, moved, lapsed, before)
