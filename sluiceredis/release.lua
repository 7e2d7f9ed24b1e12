-- Give back leases whose Take failed or timed out in the caller, which
-- cannot tell whether the script ran: each member ARGV[2..] (a bounded
-- number) is removed from the leases if a late run took it, and recorded
-- as cancelled for ARGV[1] microseconds, so that a run still queued
-- (behind a stall, or in the network) takes nothing when it comes.
--
-- KEYS[1] leases (sorted set)
-- KEYS[2] cancelled lease members (sorted set, score = when forgotten)
-- Returns how many leases were removed.

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[1])
local n = redis.call('ZREM', KEYS[1], unpack(ARGV, 2))
local exp = string.format('%.0f', math.ceil(now + ttl))
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[2], exp, ARGV[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
-- Every member was written with the same ttl, so the set may go with the
-- newest.
redis.call('PEXPIRE', KEYS[2], math.max(1, math.ceil(ttl / 1000)))
return n
