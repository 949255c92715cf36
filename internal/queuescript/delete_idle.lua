-- delete_idle.lua: delete the consumers of a group that have no pending
-- entry, have been idle for long enough, and are not to be kept.
--
-- KEYS[1]  stream key (<prefix>q:{<queue>}:stream)
-- ARGV[1]  group
-- ARGV[2]  least idle time in ms (integer >= 0)
-- ARGV[3…] names never deleted (e.g. the consumers of live processes)
--
-- XGROUP DELCONSUMER drops a consumer's pending entries with it, so only a
-- consumer with none is deleted; the check and the delete run in one
-- script, so no entry can be delivered to it in between. A consumer that
-- is deleted and later reads again is created again by XREADGROUP. The
-- pending entries of a dead consumer are first taken over by the others
-- (XAUTOCLAIM after the lock duration), which leaves it with none.
--
-- Returns  the names deleted (a list).

local group, idle = ARGV[1], tonumber(ARGV[2])
local keep = {}
for i = 3, #ARGV do keep[ARGV[i]] = true end
local ok, consumers = pcall(redis.call, "XINFO", "CONSUMERS", KEYS[1], group)
if not ok then return {} end -- no stream or no group yet
local deleted = {}
for _, c in ipairs(consumers) do
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  if tonumber(f['pending']) == 0 and tonumber(f['idle']) >= idle and not keep[f['name']] then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], group, f['name'])
    table.insert(deleted, f['name'])
  end
end
return deleted
