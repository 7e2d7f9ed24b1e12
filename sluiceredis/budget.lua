-- One refresh of one process's part of a key's budgets (sluice.WithBudget:
-- tokens a minute, say), in one round trip. Each budget is a hash: its
-- state, the fleet's level not yet granted to any process, under the field
-- "=", and each process's entry under its id. A process holds what it was
-- granted and has not spent; the fleet's level is the ungranted level plus
-- what every live process holds, never above the budget's size. The
-- ungranted level refills at the budget's rate; each refresh the caller
-- gives back what it holds beyond its want, and is granted its max-min
-- fair part of the ungranted level by the wants not yet held (what each
-- process asks for beyond what it holds), so that a process saving up for
-- a large cost keeps its part of the refill. A process that is gone (its
-- entry expired) gives back nothing: it may have spent what it held since
-- its last refresh, or, cut off from Redis, spend it still; its part comes
-- back with the refill (a process whose lanes go gives back what they
-- held first). Its unanswered costs stop counting. A state or an entry
-- that is not made of finite numbers is dropped.
--
-- A server count (what a response said remains, brought to now by the
-- caller, less the caller's own unanswered costs) sets the fleet's level,
-- less the other processes' unanswered costs (the server may not have
-- counted them yet). The level it corrects teaches the fleet its margin:
-- how much its costs were underestimated, a share of what it spent since
-- the last count, kept as the largest seen and forgotten slowly.
-- A state Redis creates (at the fleet's first refresh, or the first
-- after Redis lost the hash) guesses its level full and knows only the
-- processes that refreshed since, so what a count corrects in it says
-- nothing of the costs: counts teach nothing until one has corrected the
-- level a lease after the state was created, when every live process has
-- refreshed.
-- Times are microseconds of the Redis server's clock.
--
-- KEYS[i] the hash of budget i.
-- ARGV[1] process id   ARGV[2] lease (how long an entry lives)
-- ARGV[3] how long a budget's hash outlives its last refresh
-- then eight per budget, at 4 + 8(i-1):
--   size, rate (units a second), held (what the caller holds after what it
--   gives back), given back, want (beyond what it holds), unanswered,
--   spent since its last refresh, server count ("": none)
--
-- An entry is "expiry held unanswered want"; the state is "level time
-- margin spent spent-at-the-last-count"; "+" is when the state was
-- created, until a count has corrected it a lease after.
-- Returns, per budget: {granted (< 0: taken back), the caller's expected
-- rate, margin}, as strings.

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local me = ARGV[1]
local lease = tonumber(ARGV[2])
local keep = tonumber(ARGV[3])
local decay = 0.9995
local out = {}

local function finite(f, n)
  if #f ~= n then return false end
  for _, x in ipairs(f) do
    if x ~= x or x == math.huge or x == -math.huge then return false end
  end
  return true
end

for i, key in ipairs(KEYS) do
  local a = 4 + 8 * (i - 1)
  local size, rate = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local held, back = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local want, unans = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local spentNow, server = tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7])

  local level, at, margin, spent, recSpent = size, now, 0, 0, 0
  local fresh, created = true, nil -- fresh: no state read; created: "+"
  local heldAll, outOthers = 0, 0
  local wants = {}
  local dead = {}
  local all = redis.call('HGETALL', key)
  for j = 1, #all, 2 do
    local f = {}
    for x in string.gmatch(all[j + 1], '%S+') do f[#f + 1] = tonumber(x) end
    if all[j] == '=' then
      if finite(f, 5) then
        level, at, margin, spent, recSpent = f[1], f[2], math.min(math.max(f[3], 0), 1), f[4], f[5]
        fresh = false
      end
    elseif all[j] == '+' then
      created = finite(f, 1) and f[1] or 0
    elseif all[j] ~= me then
      if not finite(f, 4) or f[1] <= now then
        dead[#dead + 1] = all[j]
      else
        heldAll = heldAll + f[2]
        outOthers = outOthers + f[3]
        if f[4] > 0 then wants[#wants + 1] = f[4] end
      end
    end
  end
  if fresh then created = now end
  if #dead > 0 then redis.call('HDEL', key, unpack(dead)) end

  level = level + rate * math.max(now - at, 0) / 1000000 + back
  spent = spent + spentNow
  heldAll = heldAll + held
  if server then
    local delta = (server - outOthers) - (level + heldAll)
    local since = spent - recSpent
    if not created then
      margin = margin * decay
      if delta < 0 and since > 0 then margin = math.max(margin, math.min(-delta / since, 1)) end
    elseif now >= created + lease then
      redis.call('HDEL', key, '+')
    end
    recSpent = spent
    level = level + delta
  end
  level = math.max(math.min(level, size - heldAll), -size)

  -- The caller's part of the ungranted level, max-min fair by the wants
  -- beyond what each holds (water-filling; equal wants get equal parts).
  local others = 0
  for _, w in ipairs(wants) do others = others + w end
  local grant = 0
  if level > 0 and want > 0 then
    wants[#wants + 1] = want
    table.sort(wants)
    local left, n = level, #wants
    for k = 1, n do
      local g = math.min(wants[k], left / (n - k + 1))
      if wants[k] == want then grant = g break end
      left = left - g
    end
  elseif level < 0 and held > 0 then
    grant = -math.min(held, -level)
  end
  level = level - grant
  held = held + grant

  -- The caller's expected rate: its part of the refill by its want (an
  -- equal part when it wants none).
  local flow = rate / (#wants + 1)
  if want > 0 then flow = rate * want / (want + others) end

  redis.call('HSET', key, me, string.format('%.0f %.17g %.17g %.17g', now + lease, held, unans, want - math.max(grant, 0)),
    '=', string.format('%.17g %.0f %.17g %.17g %.17g', level, now, margin, spent, recSpent))
  if fresh then redis.call('HSET', key, '+', string.format('%.0f', now)) end
  redis.call('PEXPIRE', key, math.max(1, math.ceil((lease + keep) / 1000)))
  out[#out + 1] = string.format('%.17g', grant)
  out[#out + 1] = string.format('%.17g', flow)
  out[#out + 1] = string.format('%.17g', margin)
end
return out
