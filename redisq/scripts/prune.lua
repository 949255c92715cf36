-- prune.lua: delete the consumers of a group that are gone: no pending
-- entry, idle for long enough, and no live process in the presence set.
--
-- KEYS[1]  stream key (<prefix>q:{<queue>}:stream)
-- KEYS[2]  presence set (<prefix>q:{<queue>}:consumers; see presence.lua)
-- ARGV[1]  group
-- ARGV[2]  least idle time in ms (integer >= 0)
--
-- XGROUP DELCONSUMER drops a consumer's pending entries with it, so only a
-- consumer with none is deleted; the check and the delete run in one
-- script, so no entry can be delivered to it in between. A consumer that
-- is deleted and later reads again is created again by XREADGROUP. The
-- pending entries of a dead consumer are first taken over by the others
-- (XAUTOCLAIM after the lock duration), which leaves it with none.
--
-- Returns  the names deleted (a list).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local group, idle = ARGV[1], tonumber(ARGV[2])
local prefix = group .. '\0'
local live = {}
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')) do
  if string.sub(m, 1, #prefix) == prefix then
    local rest = string.sub(m, #prefix + 1)
    local sep = string.find(rest, '\0', 1, true)
    if sep then live[string.sub(rest, 1, sep - 1)] = true end
  end
end
local ok, consumers = pcall(redis.call, "XINFO", "CONSUMERS", KEYS[1], group)
if not ok then return {} end -- no stream or no group yet
local deleted = {}
for _, c in ipairs(consumers) do
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  if tonumber(f['pending']) == 0 and tonumber(f['idle']) >= idle and not live[f['name']] then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], group, f['name'])
    table.insert(deleted, f['name'])
  end
end
return deleted
