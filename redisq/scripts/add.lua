-- add.lua: idempotent add of one job to the queue stream.
--
-- KEYS[1]  dedupe key of the job  (<prefix>q:{<queue>}:dedupe:<job id>)
-- KEYS[2]  stream key             (<prefix>q:{<queue>}:stream)
-- ARGV[1]  dedupe TTL in milliseconds (integer > 0)
-- ARGV[2]  job id
-- ARGV[3]  job name
-- ARGV[4]  job payload (bytes)
-- ARGV[5]  job signature ("" = none: no sig field)
-- ARGV[6]  job headers, a JSON object of strings ("" or absent = none: no
--          headers field)
--
-- Returns  1 when the job was added (XADD <stream> * id .. name .. payload ..
--          [sig ..] [headers ..]),
--          0 when the dedupe key already existed (a duplicate: nothing added).
-- Errors   the XADD error reply, after deleting the dedupe key again, so that
--          a retry of the same job is not mistaken for a duplicate.
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  return 0
end
local f = {'id', ARGV[2], 'name', ARGV[3], 'payload', ARGV[4]}
if ARGV[5] ~= nil and ARGV[5] ~= '' then
  f[#f + 1] = 'sig'
  f[#f + 1] = ARGV[5]
end
if ARGV[6] ~= nil and ARGV[6] ~= '' then
  f[#f + 1] = 'headers'
  f[#f + 1] = ARGV[6]
end
local r = redis.pcall('XADD', KEYS[2], '*', unpack(f))
if type(r) == 'table' and r.err then
  redis.call('DEL', KEYS[1])
  return r
end
return 1
