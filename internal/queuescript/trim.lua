-- trim.lua: remove stream entries that every consumer group has acknowledged,
-- with their dedupe marks, and expired dedupe marks.
--
-- KEYS[1]  stream key                  (<prefix>q:{<queue>}:stream)
-- KEYS[2]  dedupe marks, a sorted set  (<prefix>q:{<queue>}:dedupe)
-- KEYS[3]  re-add tokens, a hash       (<prefix>q:{<queue>}:dedupe-tokens)
-- ARGV[1]  most entries, and most expired marks, to delete in one call
--          (integer > 0)
-- Returns  the number of entries deleted (integer >= 0).
--
-- Every key it touches is declared, so the same call runs on a single
-- Redis, a Sentinel-managed one and a Redis Cluster (a cluster node refuses
-- undeclared keys during a slot migration).
--
-- For every group of the stream (XINFO GROUPS) the lowest entry id it still
-- needs is min(first pending id (XPENDING summary), last-delivered-id + 1):
-- pending entries may be redelivered, undelivered ones are still to come.
-- Entries below the lowest id over all groups, acknowledged by every group,
-- are deleted (XTRIM MINID, exact, not "~"), at most ARGV[1] per call
-- (XRANGE ... COUNT), so one call stays short. A stream without groups is
-- left alone (nobody has acknowledged anything).
--
-- The dedupe mark and re-add token of every deleted entry (from its "id"
-- field) are deleted with it: once every group has acknowledged a job, its
-- receivers' inboxes hold it, so a later re-add of the id is dropped there;
-- keeping the mark until it expires would make Redis memory grow with
-- traffic. Entries without an "id" field have no mark and are deleted.
-- Marks that expired (scored below the server's time) go too, with their
-- tokens, stream or not: the marks of jobs whose entries were lost
-- otherwise stay. The placeholder "" is never deleted.

-- cmp compares two decimal strings without leading zeros: -1, 0 or 1.
local function cmp(a, b)
  if #a ~= #b then return (#a < #b) and -1 or 1 end
  if a == b then return 0 end
  return (a < b) and -1 or 1
end

-- split turns "ms-seq" into its two decimal parts.
local function split(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return ms, seq
end

local function idcmp(a, b)
  local ams, aseq = split(a)
  local bms, bseq = split(b)
  local c = cmp(ams, bms)
  if c ~= 0 then return c end
  return cmp(aseq, bseq)
end

-- incr adds one to a decimal string exactly (sequence numbers are 64-bit,
-- beyond what a Lua number holds).
local function incr(s)
  local digits = {}
  for i = 1, #s do digits[i] = string.byte(s, i) - 48 end
  local i = #digits
  while i >= 1 do
    if digits[i] < 9 then
      digits[i] = digits[i] + 1
      break
    end
    digits[i] = 0
    i = i - 1
  end
  local out = {}
  if i == 0 then out[1] = '1' end
  for j = 1, #digits do out[#out + 1] = tostring(digits[j]) end
  return table.concat(out)
end

local function next_id(id)
  local ms, seq = split(id)
  return ms .. '-' .. incr(seq)
end

local batch = tonumber(ARGV[1])

-- forget deletes the marks and tokens of ids, in slices (unpack has a
-- limit on the number of values).
local function forget(ids)
  for i = 1, #ids, 1000 do
    local part = {unpack(ids, i, math.min(i + 999, #ids))}
    redis.call('ZREM', KEYS[2], unpack(part))
    redis.call('HDEL', KEYS[3], unpack(part))
  end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
forget(redis.call('ZRANGE', KEYS[2], '-inf', now, 'BYSCORE', 'LIMIT', 0, batch))

if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return 0 end

local lowest = nil
for _, g in ipairs(groups) do
  local name, pending, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1]
    elseif g[i] == 'pending' then pending = g[i + 1]
    elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
  end
  local need = next_id(last)
  if pending > 0 then
    local summary = redis.call('XPENDING', KEYS[1], name)
    local first = summary[2]
    if first and idcmp(first, need) < 0 then need = first end
  end
  if lowest == nil or idcmp(need, lowest) < 0 then lowest = need end
end

local doomed = redis.call('XRANGE', KEYS[1], '-', '(' .. lowest, 'COUNT', batch)
if #doomed == 0 then return 0 end

local ids = {}
for _, e in ipairs(doomed) do
  local f = e[2]
  for i = 1, #f, 2 do
    if f[i] == 'id' then
      -- "" is the marks' placeholder, never a job's id.
      if f[i + 1] ~= '' then ids[#ids + 1] = f[i + 1] end
      break
    end
  end
end
forget(ids)
local upto = next_id(doomed[#doomed][1])
if idcmp(upto, lowest) > 0 then upto = lowest end
return redis.call('XTRIM', KEYS[1], 'MINID', upto)
