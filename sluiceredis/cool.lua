-- Extend a budget's cooldown to now + ARGV[1] microseconds of the Redis
-- server's clock, unless it already ends later; then remove this process's
-- leases ARGV[2..] (a bounded number), which it gives back with the call.
--
-- KEYS[1] cooldown end (microseconds)   KEYS[2] leases (sorted set)
-- Returns 1 if the cooldown was extended, 0 if it already ended later.

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local upto = now + tonumber(ARGV[1])
local cur = tonumber(redis.call('GET', KEYS[1]))
local extended = 0
if not (cur and cur >= upto) then
  redis.call('SET', KEYS[1], string.format('%.0f', upto), 'PX', math.max(1, math.ceil((upto - now) / 1000)))
  extended = 1
end
if #ARGV >= 2 then
  redis.call('ZREM', KEYS[2], unpack(ARGV, 2))
end
return extended
