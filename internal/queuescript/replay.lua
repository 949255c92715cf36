-- replay.lua: put one dead-letter entry back on its queue stream.
--
-- KEYS[1]  dead-letter stream (<prefix>q:{<queue>}:dead)
-- KEYS[2]  stream key         (<prefix>q:{<queue>}:stream)
-- KEYS[3]  dedupe marks, a sorted set  (<prefix>q:{<queue>}:dedupe)
-- ARGV[1]  the dead-letter entry's id ("ms-seq")
-- ARGV[2]  dedupe TTL in milliseconds (integer > 0)
--
-- Every key is declared (a cluster node refuses undeclared keys during a
-- slot migration): the job's mark goes into the queue's sorted set, so the
-- entry's job id need not be known before the call.
--
-- In one step: XADD <stream> * id .. name .. payload .. [sig ..]
-- [headers ..] with the entry's fields (its signature and headers too, so a
-- receiver that checks signatures accepts it), mark the job until now + ttl
-- (as a re-add does, see add.lua: a later plain add of the id is a no-op),
-- XDEL the dead-letter entry.
--
-- Returns  the new stream entry id, or false (a nil reply) when the
--          dead-letter entry does not exist (already replayed or dropped:
--          a repeated replay is a no-op).
-- Errors   "ERR dead-letter entry lacks id, name or payload" (nothing done;
--          such an entry can only be dropped).
local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #e == 0 then return false end
local f = e[1][2]
local v = {}
for i = 1, #f, 2 do v[f[i]] = f[i + 1] end
if not v['id'] or v['id'] == '' or not v['name'] or not v['payload'] then
  return redis.error_reply('ERR dead-letter entry lacks id, name or payload')
end
local a = {'id', v['id'], 'name', v['name'], 'payload', v['payload']}
for _, k in ipairs({'sig', 'headers'}) do
  if v[k] and v[k] ~= '' then
    a[#a + 1] = k
    a[#a + 1] = v[k]
  end
end
local id = redis.call('XADD', KEYS[2], '*', unpack(a))
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), v['id'])
redis.call('ZADD', KEYS[3], 'NX', '+inf', '')
redis.call('XDEL', KEYS[1], ARGV[1])
return id
