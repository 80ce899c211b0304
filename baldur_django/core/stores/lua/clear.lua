-- Reset (mirrors rules.op_clear): back to a fresh CLOSED record whatever it held -- the force,
-- the probing round and the backoff count cleared -- in a new version, frozen or not.
local previous = rec.forced
clear_force(rec)
bump(rec, 'closed', now, 'reset')
rec.opened_at = NULL
rec.open_until = NULL
return finish(key, rec, now, previous, lapsed, before)
