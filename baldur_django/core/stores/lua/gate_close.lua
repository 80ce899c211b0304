-- Close one service's Retry-After gate for the whole fleet, keeping the later end.
-- KEYS[1]: the service's gate key; ARGV[1]: seconds the gate stays closed from now.
-- The key holds the end (Unix milliseconds on the store's clock, Redis TIME, so the
-- workers' own clocks do not matter) and expires at that end. Answers the milliseconds
-- left until the stored end after the write (0: the gate is open).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wanted = now + math.ceil(tonumber(ARGV[1]) * 1000)
local stored = tonumber(redis.call('GET', KEYS[1]) or '')
if stored == nil or stored < wanted then
  if wanted <= now then return 0 end
  redis.call('SET', KEYS[1], string.format('%d', wanted), 'PX', string.format('%d', wanted - now))
  stored = wanted
end
return math.max(0, stored - now)
