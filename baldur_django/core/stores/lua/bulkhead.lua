-- Leased slots of a fleet bulkhead, taken or given back in one call.
-- KEYS[1]: a sorted set of slot token -> end of its lease (milliseconds of Redis TIME).
-- ARGV[1]: 'take' or 'give'; ARGV[2]: the slot's token; ARGV[3]: the number of slots;
-- ARGV[4]: the lease, in milliseconds.
-- Leases that have ended are dropped first, so the slots of a process that died come back.
-- take: 1 when the token now holds a slot, 0 when every slot is leased.
-- give: 1 when the token held a slot, 0 when it did not (given back before, or lapsed).
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if ARGV[1] == 'give' then
  return redis.call('ZREM', key, ARGV[2])
end
if redis.call('ZCARD', key) >= tonumber(ARGV[3]) then
  return 0
end
local lease = tonumber(ARGV[4])
redis.call('ZADD', key, now + lease, ARGV[2])
-- the set outlives its longest lease, never more: an idle service leaves no key behind
if redis.call('PTTL', key) < lease then
  redis.call('PEXPIRE', key, lease)
end
return 1
