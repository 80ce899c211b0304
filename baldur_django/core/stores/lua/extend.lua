-- KEYS[1]: lock key; ARGV[1]: token; ARGV[2]: new lifetime in ms.
-- Only the owner extends: renew the expiry if the token still holds the lock.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
