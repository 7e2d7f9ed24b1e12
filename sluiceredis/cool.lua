-- Extend a budget's cooldown to now + ARGV[1] microseconds of the Redis
-- server's clock, unless it already ends later.
--
-- KEYS[1] cooldown end (integer microseconds)
-- Returns 1 if the cooldown was extended, 0 if it already ended later.

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local upto = now + tonumber(ARGV[1])
local cur = tonumber(redis.call('GET', KEYS[1]))
if cur and cur >= upto then
  return 0
end
redis.call('SET', KEYS[1], string.format('%.0f', upto), 'PX', math.ceil((upto - now) / 1000))
return 1
