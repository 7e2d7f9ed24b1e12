-- One refresh of one process's share of one budget (see Backend), in one
-- round trip. Each process's entry in a hash says what it wants, per
-- priority level, and what it holds; the budget is apportioned among the
-- live entries by priority first (a level's wants are met, fleet-wide,
-- before any lower level's, but for the low share of the levels below
-- the highest that wants: see part) and max-min fairly within a level,
-- and what nobody wants is spread evenly. The caller is granted its part,
-- but never more than the others' grants leave: a share that moves from
-- one process to another is taken from the first at its refresh and given
-- to the second at its next one, so the grants held never add up to more
-- than the budget. Times are microseconds of the Redis server's clock.
--
-- KEYS[1] the entries (hash: process id -> entry)   KEYS[2] cooldown end
-- KEYS[3] set for the recovery after Redis lost entries (see below)
-- ARGV[1] process id   ARGV[2] lease (how long the entry lives)
-- ARGV[3] rate (tokens a second; 0: not paced)   ARGV[4] burst
-- ARGV[5] in-flight cap (0: none)   ARGV[6] attempts in flight now
-- ARGV[7..9] rate wanted per level   ARGV[10..12] places wanted per level
-- ARGV[13] after a call whose reply the caller lacks, the rate it holds
-- (negative: none; see below)
-- ARGV[14] the channel on which to name processes (see below)
-- ARGV[15] the low share (see part; 0: strict priority)
-- ARGV[16] the version of the caller's entry that its share was granted
-- at (0: it holds none)   ARGV[17] the rate it holds   ARGV[18] the places
-- it holds (-1: no cap)
--
-- An entry is "expiry rate burst cap granted-rate granted-places w1 w2 w3
-- p1 p2 p3 version"; the version grows with each write of the entry.
-- Returns {granted rate, granted places (-1: no cap), live processes,
-- cooldown left, the budget's rate, its burst, its cap, 1 if the caller
-- got less than its part (it may refresh sooner), the caller's entry's
-- version}; rates as strings, to keep their fractions.
--
-- A share that moves would idle between the refresh of the process that
-- gives it up and that of the one it is owed to, and the owed process
-- would wait as long. So, on the channel (see nudge.go):
--  * when the caller is owed rate that others hold, the script names the
--    processes holding more than their part (the most over first, until
--    they cover what the caller is owed), which refresh at once and give
--    it up;
--  * when rate is left that nobody holds (the caller gave some up, or a
--    process is gone), it grants it at once to the processes owed some,
--    the most owed first, in their entries, and sends each its new rate
--    and entry version as id=version:rate. A process takes such a rate
--    unless it has refreshed since (its entry's version is higher): the
--    entries never hold more than the rate, and a process never sends at
--    more than its entry holds.
-- Moves under a hundredth of the rate are left to the refreshes.
--
-- A call whose reply was lost may have run and recorded a smaller share
-- than the one its process still sends at, and will send at until a reply
-- comes (its last share, then its fallback). The process's next call
-- passes that rate (ARGV[13]): it takes no more, for Redis may have lost
-- the others' entries meanwhile, and its entry holds no less until a
-- reply has come.
--
-- Redis may lose entries whose processes still send at their shares (it
-- restarted empty, the hash was flushed or evicted, a failover lost the
-- latest writes), and would grant the rate they hold to the first process
-- to ask. A caller that holds a share (ARGV[16..18]) whose entry is
-- missing, expired or of an older version finds such a loss, and starts
-- the recovery (KEYS[3]) for a lease: each process's lease, held before
-- the loss, has then ended or been renewed, and Redis knows every share
-- held again. During the recovery no caller is granted more than it holds
-- (a process that held nothing is granted nothing), and rate that nobody
-- holds is not handed out: the processes Redis forgot may hold it.

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local me = ARGV[1]
local self = {
  exp = now + tonumber(ARGV[2]),
  rate = tonumber(ARGV[3]), burst = tonumber(ARGV[4]), cap = tonumber(ARGV[5]),
  gr = 0, gp = 0,
  w = {tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])},
  p = {tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])},
  seq = 0,
}
local inflight = tonumber(ARGV[6])

local procs, dead = {}, {}
local mine -- the expiry of the caller's entry; nil: none
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f = {}
  for x in string.gmatch(all[i + 1], '%S+') do f[#f + 1] = tonumber(x) end
  -- An entry of twelve fields, without a version, is one written before
  -- versions were: its version is 0.
  if all[i] == me then
    if #f == 12 or #f == 13 then mine = f[1] end
    if #f == 13 then self.seq = f[13] end
  elseif (#f ~= 12 and #f ~= 13) or f[1] <= now then
    dead[#dead + 1] = all[i]
  else
    procs[#procs + 1] = {
      id = all[i], exp = f[1], rate = f[2], burst = f[3], cap = f[4], gr = f[5], gp = f[6],
      w = {f[7], f[8], f[9]}, p = {f[10], f[11], f[12]}, seq = f[13] or 0,
    }
  end
end
if #dead > 0 then redis.call('HDEL', KEYS[1], unpack(dead)) end
procs[#procs + 1] = self
local n = #procs

-- The recovery (see above): started, or made to last a lease from now, by
-- a caller that finds its entry lost.
local heldSeq, heldRate, heldPlaces = tonumber(ARGV[16]), tonumber(ARGV[17]), tonumber(ARGV[18])
local recovery = redis.call('PTTL', KEYS[3])
if heldSeq > 0 and (not mine or mine <= now or self.seq < heldSeq) then
  local lease = math.max(1, math.ceil(tonumber(ARGV[2]) / 1000))
  if recovery < lease then
    redis.call('SET', KEYS[3], 1, 'PX', lease)
    recovery = lease
  end
end
local recovering = recovery > 0

-- The budget is the lowest any live process passes: one that learned a
-- lower rate from the server holds the fleet to it.
local rate, burst, cap = 0, 0, 0
for _, e in ipairs(procs) do
  if e.rate > 0 and (rate == 0 or e.rate < rate) then rate = e.rate end
  if e.burst > 0 and (burst == 0 or e.burst < burst) then burst = e.burst end
  if e.cap > 0 and (cap == 0 or e.cap < cap) then cap = e.cap end
end

-- The part of the levels below the highest that wants (ARGV[15], the
-- caller's sluice.WithLowShare; 0: strict priority): they are given up to
-- c / lowShare first, in equal parts, what one does not want going to
-- the others.
local lowShare = tonumber(ARGV[15]) or 0

-- Up to c divided max-min fairly among the wants in field f at level l,
-- less what given (nil: nothing) gave each already.
local function fill(c, f, l, given)
  local give, idx = {}, {}
  local function rest(i)
    if given then return procs[i][f][l] - given[i] end
    return procs[i][f][l]
  end
  for i = 1, n do
    give[i] = 0
    if rest(i) > 0 then idx[#idx + 1] = i end
  end
  table.sort(idx, function(a, b) return rest(a) < rest(b) end)
  local left = c
  for k = 1, #idx do
    local i = idx[k]
    local g = math.min(rest(i), left / (#idx - k + 1))
    give[i] = g
    left = left - g
  end
  return give
end

-- Hands out up to left whole units as if one at a time, each to the first
-- i with the least have[i] among those under top[i], adding them to have;
-- returns how many it handed out. Computed at once, as fillWhole in
-- apportion.go: every i under the level the units reach is raised to it
-- (or its top), and the units left over go one each to the first of those
-- at that level still under their tops.
local function fillWhole(left, have, top)
  if n == 0 or left < 1 then return 0 end
  local function need(level)
    local s = 0
    for i = 1, n do
      local m = math.min(top[i], level)
      if m > have[i] then
        s = s + m - have[i]
        if s > left then return s end
      end
    end
    return s
  end
  local lo = have[1]
  for i = 2, n do lo = math.min(lo, have[i]) end
  local hi = lo + left + 1
  while lo + 1 < hi do
    local mid = math.floor((lo + hi) / 2)
    if need(mid) <= left then lo = mid else hi = mid end
  end
  local given = 0
  for i = 1, n do
    local m = math.min(top[i], lo)
    if m > have[i] then
      given = given + m - have[i]
      have[i] = m
    end
  end
  for i = 1, n do
    if given >= left then break end
    if have[i] == lo and top[i] > lo then
      have[i] = have[i] + 1
      given = given + 1
    end
  end
  return given
end

-- The caller's part of capacity c by the wants in field f: levels in
-- order, max-min fair within one (water-filling: the smallest wants are
-- met in full, the rest share equally what is left), then what is left
-- evenly; but while a level below another wants some, the levels below
-- the highest that wants are first given up to c / lowShare (rates only;
-- see lowShare). whole: in whole units (places), handed out one at a time
-- to the process given least at the level (the caller last among equals).
local function part(c, f, whole)
  local give = {}
  for i = 1, n do give[i] = 0 end
  local left = c
  local given = {}
  if not whole and lowShare >= 2 then
    local total, low, top = {0, 0, 0}, {}
    for l = 1, 3 do
      for i = 1, n do total[l] = total[l] + procs[i][f][l] end
      if total[l] > 0 then
        if top then low[#low + 1] = l else top = l end
      end
    end
    -- The level that wants least first: what it leaves goes to the next.
    table.sort(low, function(a, b) return total[a] < total[b] or total[a] == total[b] and a < b end)
    local floor = c / lowShare
    for k, l in ipairs(low) do
      given[l] = fill(floor / (#low - k + 1), f, l, nil)
      for i = 1, n do
        give[i] = give[i] + given[l][i]
        left = left - given[l][i]
        floor = floor - given[l][i]
      end
    end
  end
  for l = 1, 3 do
    if left <= 0 then break end
    if whole then
      local at, top = {}, {}
      for i = 1, n do at[i], top[i] = 0, math.max(math.floor(procs[i][f][l]), 0) end
      left = left - fillWhole(math.floor(left), at, top)
      for i = 1, n do give[i] = give[i] + at[i] end
    else
      local g = fill(left, f, l, given[l])
      for i = 1, n do
        give[i] = give[i] + g[i]
        left = left - g[i]
      end
    end
  end
  if whole then
    local top = {}
    for i = 1, n do top[i] = math.huge end
    fillWhole(math.floor(left), give, top)
  elseif left > 0 then
    for i = 1, n do give[i] = give[i] + left / n end
  end
  return give
end

local short = 0
local gr = 0
local most = tonumber(ARGV[13])
local parts
local owed = 0
if rate > 0 then
  parts = part(rate, 'w', false)
  local want = parts[n]
  local held = 0
  for i = 1, n - 1 do held = held + procs[i].gr end
  gr = math.max(0, math.min(want, rate - held))
  if gr < want - 1e-9 then short = 1 end
  owed = want - gr
  if most >= 0 then gr = math.min(gr, most) end
  if recovering then gr = math.min(gr, heldRate) end
end
local gp = -1
if cap > 0 then
  local want = part(cap, 'p', true)[n]
  local held = 0
  for i = 1, n - 1 do held = held + procs[i].gp end
  gp = math.max(0, math.min(want, cap - held))
  if gp < want then short = 1 end
  if recovering and heldPlaces >= 0 then gp = math.min(gp, heldPlaces) end
end

-- What the caller holds counts its attempts in flight, which outlive a
-- smaller grant, and what it held before a lost reply (see above).
self.gr, self.gp = math.max(gr, most), math.max(gp, inflight)
local function put(e)
  e.seq = e.seq + 1
  redis.call('HSET', KEYS[1], e.id, string.format('%.0f %.17g %d %d %.17g %d %.17g %.17g %.17g %d %d %d %d',
    e.exp, e.rate, e.burst, e.cap, e.gr, e.gp,
    e.w[1], e.w[2], e.w[3], e.p[1], e.p[2], e.p[3], e.seq))
end
self.id = me
put(self)
-- Who to name on the channel (see above): those over their parts when the
-- caller is owed, those owed when rate is left unheld.
if parts then
  local least = rate / 100
  local function name(amount, owes, ids)
    if amount < least then return end
    local cand = {}
    for i = 1, n - 1 do
      local d = owes(i)
      if d > 1e-9 then cand[#cand + 1] = {i, d} end
    end
    table.sort(cand, function(a, b) return a[2] > b[2] end)
    for _, c in ipairs(cand) do
      if amount <= 1e-9 then break end
      ids[#ids + 1] = procs[c[1]].id
      amount = amount - c[2]
    end
  end
  local ids = {}
  name(owed, function(i) return procs[i].gr - parts[i] end, ids)
  -- Rate nobody holds goes at once to those owed it, the most owed first:
  -- their entries hold it from now, and the message tells them. Not
  -- during the recovery, when processes Redis forgot may hold it.
  local free = rate
  for i = 1, n do free = free - procs[i].gr end
  if free >= least and not recovering then
    local cand = {}
    for i = 1, n - 1 do
      if parts[i] - procs[i].gr > 1e-9 then cand[#cand + 1] = i end
    end
    table.sort(cand, function(a, b) return parts[a] - procs[a].gr > parts[b] - procs[b].gr end)
    for _, i in ipairs(cand) do
      if free <= 1e-9 then break end
      local e = procs[i]
      local g = math.min(parts[i] - e.gr, free)
      e.gr = e.gr + g
      free = free - g
      put(e)
      ids[#ids + 1] = string.format('%s=%d:%.17g', e.id, e.seq, e.gr)
    end
  end
  if #ids > 0 then redis.call('PUBLISH', ARGV[14], table.concat(ids, ' ')) end
end

local last = 0
for _, e in ipairs(procs) do last = math.max(last, e.exp) end
redis.call('PEXPIRE', KEYS[1], math.max(1, math.ceil((last - now) / 1000)))

local cool = tonumber(redis.call('GET', KEYS[2]))
local coolLeft = 0
-- cool.lua shares no cooldown longer than a day: a longer one was written
-- by something else, and is told as a day (see maxCool).
if cool and cool > now then coolLeft = math.min(math.ceil(cool - now), 86400000000) end

return {string.format('%.17g', gr), gp, n, coolLeft, string.format('%.17g', rate), burst, cap, short, self.seq}
