-- One admission decision for one budget, in one round trip: the shared
-- cooldown, then the in-flight leases, then GCRA. Times are microseconds of
-- the Redis server's clock, so process clocks do not matter. They are
-- doubles: integers until 2^53 (year 2255), with a fraction of 1/4 us
-- (until 2041, 1/2 us after), so that an emission interval need not be a
-- whole number of microseconds.
--
-- KEYS[1] GCRA theoretical arrival time   KEYS[2] cooldown end
-- KEYS[3] leases (sorted set, score = expiry)
-- KEYS[4] cancelled lease members (sorted set, score = when forgotten)
-- KEYS[5] processes waiting for a lease (sorted set, score = when it
--         began), oldest first; also the name of the channel a release
--         wakes them on (see done.lua)
-- ARGV[1] emission interval (0: not paced)   ARGV[2] burst tolerance
-- ARGV[3] lease cap (0: none)   ARGV[4] lease ttl   ARGV[5] lease member
-- ARGV[6] longest wait to return when every lease is held
-- ARGV[7] most tokens to take (>= 1)   ARGV[8] horizon: tokens after the
--         first are taken only if due within it
-- ARGV[9] the calling process, to wake when a lease is given back
-- ARGV[10..] this process's leases to remove first (a bounded number)
--
-- Returns {status, wait, ...}, waits in whole microseconds rounded up: 0
-- taken now; 1 reserved, due in wait (the token is the caller's, it must
-- not send before then); 2 cooling down for wait; 3 every lease held, ask
-- again in wait. With statuses 0 and 1, the reply is {status, w1, ..., wn,
-- t1, ..., tn} for the n tokens taken, in order: wi is when token i is due,
-- and ti (rounded down) its theoretical arrival time, after which sending
-- it is late (see Backend.Take); all ti are 0 when not paced. With a lease cap, each
-- token takes a lease: ARGV[5] for the first, ARGV[5] .. '.' .. i for the
-- i-th after it. 4: ARGV[5] was cancelled (see release.lua): its caller
-- gave up on this call before it ran, so it takes nothing.

-- Writes after TIME need effects replication; it is the only mode from
-- Redis 7 on, and this call turns it on for Redis 3.2 to 6.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- Each lease given back wakes the process that has waited longest for one
-- (those that began more than two waits ago have asked again since).
local function freed(n)
  local old = now - 2 * tonumber(ARGV[6])
  while n > 0 do
    local w = redis.call('ZPOPMIN', KEYS[5])
    if #w == 0 then
      return
    end
    if tonumber(w[2]) >= old then
      redis.call('PUBLISH', KEYS[5], w[1])
      n = n - 1
    end
  end
end

if #ARGV >= 10 then
  freed(redis.call('ZREM', KEYS[3], unpack(ARGV, 10)))
end

-- A call its caller timed out on may reach a stalled server and run after
-- the caller has released what it might have taken: it must take nothing.
if ARGV[5] ~= '' and redis.call('ZSCORE', KEYS[4], ARGV[5]) then
  return {4, 0}
end

local cool = tonumber(redis.call('GET', KEYS[2]))
if cool and cool > now then
  return {2, math.ceil(cool - now)}
end

local want = tonumber(ARGV[7])
local cap = tonumber(ARGV[3])
if cap > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local free = cap - redis.call('ZCARD', KEYS[3])
  if free <= 0 then
    local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    local wait = math.max(math.ceil(math.min(tonumber(first[2]) - now, tonumber(ARGV[6]))), 1)
    -- The caller waits to be woken (at the back of the line if it was
    -- in it), for at most the wait, and asks again.
    redis.call('ZADD', KEYS[5], now, ARGV[9])
    redis.call('PEXPIRE', KEYS[5], math.max(1, math.ceil(2 * tonumber(ARGV[6]) / 1000)))
    return {3, wait}
  end
  want = math.min(want, free)
end

local waits, tats = {}, {}
local interval = tonumber(ARGV[1])
if interval > 0 then
  -- GCRA: a token is due at tat - tolerance. It is taken (or reserved, when
  -- due later) by moving tat one interval on, so that processes polling for
  -- the same token cannot all win it, and none need ask twice.
  local tat = math.max(tonumber(redis.call('GET', KEYS[1])) or now, now)
  local tol, horizon = tonumber(ARGV[2]), tonumber(ARGV[8])
  for i = 1, want do
    local wait = math.max(tat - tol - now, 0)
    if i > 1 and wait > horizon then
      break
    end
    waits[i] = wait
    tats[i] = tat - now
    local nt = tat + interval
    -- tat + interval is rounded to the nearest double; never down, which
    -- would hand out a fraction of a token too many every time.
    if nt - tat < interval then
      local _, e = math.frexp(nt)
      nt = nt + 2 ^ (e - 53)
    end
    tat = nt
  end
  -- Once tat has passed the state is the same as no state: let it vanish.
  -- %.17g keeps every digit of the double.
  redis.call('SET', KEYS[1], string.format('%.17g', tat), 'PX', math.max(1, math.ceil((tat - now) / 1000)))
else
  for i = 1, want do
    waits[i], tats[i] = 0, 0
  end
end

if cap > 0 then
  -- A reserved token's lease starts counting at the token's due time.
  local ttl = tonumber(ARGV[4])
  for i, wait in ipairs(waits) do
    local m = ARGV[5]
    if i > 1 then
      m = m .. '.' .. (i - 1)
    end
    redis.call('ZADD', KEYS[3], string.format('%.0f', math.ceil(now + wait + ttl)), m)
  end
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', KEYS[3], math.max(1, math.ceil((tonumber(last[2]) - now) / 1000)))
end

local out = {1, 0}
if waits[1] == 0 then
  out[1] = 0
end
for i, wait in ipairs(waits) do
  out[i + 1] = math.ceil(wait)
  out[#waits + i + 1] = math.floor(tats[i])
end
return out
