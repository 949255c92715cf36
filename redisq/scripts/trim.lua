-- trim.lua: remove stream entries that every consumer group has acknowledged.
--
-- On a Redis Cluster, two calls, so that every key the trim touches is
-- declared (a cluster node refuses undeclared keys during a slot
-- migration); elsewhere one call (direct) does both:
--
-- plan:
-- KEYS[1]  stream key (<prefix>q:{<queue>}:stream)
-- ARGV[1]  "plan"
-- ARGV[2]  most entries to delete in one call (integer > 0)
-- Returns  a list: the number of entries a trim would delete now (integer
--          >= 0; entries without an "id" field count too), then their job
--          ids (the "id" fields), in stream order, each once.
--
-- trim:
-- KEYS[1]  stream key
-- KEYS[2…] the dedupe keys of the job ids plan returned
--          (<prefix>q:{<queue>}:dedupe:<id>)
-- ARGV[1]  "trim"
-- ARGV[2]  most entries to delete in one call (integer > 0)
-- ARGV[3…] the job ids, in KEYS[2…]'s order
-- Returns  the number of entries deleted (integer >= 0).
--
-- direct (not on a Redis Cluster: it touches keys it does not declare):
-- KEYS[1]  stream key
-- ARGV[1]  "direct"
-- ARGV[2]  most entries to delete in one call (integer > 0)
-- ARGV[3]  the dedupe key prefix (<prefix>q:{<queue>}:dedupe:)
-- Returns  the number of entries deleted (integer >= 0): plan and trim in
--          one call, half the work and no job ids sent back and forth, for
--          a single Redis or a Sentinel-managed one.
--
-- For every group of the stream (XINFO GROUPS) the lowest entry id it still
-- needs is min(first pending id (XPENDING summary), last-delivered-id + 1):
-- pending entries may be redelivered, undelivered ones are still to come.
-- Entries below the lowest id over all groups, acknowledged by every group,
-- are deleted (XTRIM MINID, exact, not "~"), at most ARGV[2] per call
-- (XRANGE ... COUNT), so one call stays short. A stream without groups is
-- left alone (nobody has acknowledged anything). Both calls compute the
-- lowest id afresh, so a trim never deletes an entry a group needs, however
-- the stream changed since the plan.
--
-- The dedupe key of every deleted entry (from its "id" field) is deleted
-- with it: once every group has acknowledged a job, its receivers' inboxes
-- hold it, so a later re-add of the id is dropped there; keeping the key
-- until its TTL would make Redis memory grow with traffic. The trim stops
-- before the first entry whose job id was not declared (the stream grew
-- or changed since the plan), so no key is kept by mistake; entries without
-- an "id" field have no dedupe key and are deleted.

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

local mode, batch = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[1]) == 0 then
  if mode == 'plan' then return {0} end
  return 0
end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then
  if mode == 'plan' then return {0} end
  return 0
end

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

-- jobid returns the entry's "id" field, or nil.
local function jobid(e)
  local f = e[2]
  for i = 1, #f, 2 do
    if f[i] == 'id' then return f[i + 1] end
  end
  return nil
end

if mode == 'direct' then
  for _, e in ipairs(doomed) do
    local id = jobid(e)
    if id then redis.call('DEL', ARGV[3] .. id) end
  end
  if #doomed == 0 then return 0 end
  local upto = next_id(doomed[#doomed][1])
  if idcmp(upto, lowest) > 0 then upto = lowest end
  return redis.call('XTRIM', KEYS[1], 'MINID', upto)
end
if mode == 'plan' then
  local ids, seen = {#doomed}, {}
  for _, e in ipairs(doomed) do
    local id = jobid(e)
    if id and not seen[id] then
      seen[id] = true
      ids[#ids + 1] = id
    end
  end
  return ids
end
if mode ~= 'trim' and mode ~= 'direct' then
  return redis.error_reply('ERR trim.lua: mode ' .. tostring(mode) .. ' is not plan, trim or direct')
end

-- keyof returns the dedupe key of job id: from its prefix (direct), or as
-- declared (trim; nil for an id the plan did not return).
local keyof
if mode == 'direct' then
  keyof = function(id) return ARGV[3] .. id end
else
  local declared = {}
  for i = 3, #ARGV do declared[ARGV[i]] = KEYS[i - 1] end
  keyof = function(id) return declared[id] end
end
local last = nil
for _, e in ipairs(doomed) do
  local id = jobid(e)
  if id then
    local key = keyof(id)
    if not key then break end
    redis.call('DEL', key)
  end
  last = e[1]
end
if last == nil then return 0 end
-- Trim no further than the entries whose dedupe keys went above.
local upto = next_id(last)
if idcmp(upto, lowest) > 0 then upto = lowest end
return redis.call('XTRIM', KEYS[1], 'MINID', upto)
