-- Give back leases of attempts that are done, and wake the processes that
-- wait for one: for each lease given back, the process that has waited
-- longest (take.lua lines them up in KEYS[2]) is popped, and its name
-- published on the channel named KEYS[2], which waiting processes
-- subscribe to. With nobody waiting, it costs a ZREM and a ZPOPMIN.
--
-- KEYS[1] leases (sorted set)   KEYS[2] waiting processes and channel
-- ARGV[1] take.lua's longest wait: a waiter that began more than two of
--         them ago has asked again since, and is skipped
-- ARGV[2..] the leases (a bounded number)
-- Returns how many leases were removed.

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = redis.call('ZREM', KEYS[1], unpack(ARGV, 2))
local old = now - 2 * tonumber(ARGV[1])
local left = n
while left > 0 do
  local w = redis.call('ZPOPMIN', KEYS[2])
  if #w == 0 then
    break
  end
  if tonumber(w[2]) >= old then
    redis.call('PUBLISH', KEYS[2], w[1])
    left = left - 1
  end
end
return n
