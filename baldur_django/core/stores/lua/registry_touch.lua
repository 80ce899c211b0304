-- KEYS[1]: the registry sorted set; ARGV[1]: breaker name. Score = Redis TIME.
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], tonumber(t[1]) + tonumber(t[2]) / 1000000, ARGV[1])
return 1
