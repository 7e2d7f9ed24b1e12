-- Renew this process's leases ARGV[2..] (a bounded number) on one budget:
-- each that is still in the set expires ARGV[1] microseconds from now on
-- the Redis server's clock, unless it already expires later. A lease that
-- has expired and been removed is not put back: its place may be taken.
--
-- KEYS[1] leases (sorted set, score = expiry)
-- Returns how many leases were moved on.

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local exp = string.format('%.0f', math.ceil(now + tonumber(ARGV[1])))
local n = 0
for i = 2, #ARGV do
  -- XX: only leases still held; GT: never shorten one (a reserved token's
  -- lease counts from its due time).
  n = n + redis.call('ZADD', KEYS[1], 'XX', 'GT', 'CH', exp, ARGV[i])
end
if n > 0 then
  local ms = math.max(1, math.ceil(tonumber(ARGV[1]) / 1000))
  if redis.call('PTTL', KEYS[1]) < ms then
    redis.call('PEXPIRE', KEYS[1], ms)
  end
end
return n
