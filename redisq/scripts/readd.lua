-- readd.lua: add one job to the queue stream again, whatever its dedupe key
-- says (the re-drive of a job whose stream entry may be gone while its
-- dedupe key is still there: a FLUSHALL followed by a re-add, an XDEL, a
-- failover to a replica that had the key but not the entry, …). The
-- receiver's inbox drops the copy if it already has the job.
--
-- KEYS[1]  dedupe key of the job  (<prefix>q:{<queue>}:dedupe:<job id>)
-- KEYS[2]  stream key             (<prefix>q:{<queue>}:stream)
-- ARGV[1]  dedupe TTL in milliseconds (integer > 0)
-- ARGV[2]  job id
-- ARGV[3]  job name
-- ARGV[4]  job payload (bytes)
-- ARGV[5]  job signature ("" = none: no sig field), as in add.lua
-- ARGV[6]  job headers ("" or absent = none: no headers field), as in
--          add.lua
-- ARGV[7]  the re-add's token, unique per Readd call (non-empty)
--
-- The token makes a resend of the same call's command a no-op: the dedupe
-- key holds the token of the call that re-added the job last, so a second
-- run with that token (a client that resent its pipeline) finds it and
-- adds nothing. A later call, with another token, adds the job again.
--
-- Returns  1 (the job was added: SET <dedupe key> <token> PX ttl, then XADD
--          <stream> * id .. name .. payload .. [sig ..] [headers ..]; or
--          this call had added it already).
-- Errors   the XADD error reply (the dedupe key is then left set: a later
--          plain add of the id is a no-op, a later re-add adds it).
if redis.call('GET', KEYS[1]) == ARGV[7] then
  return 1
end
redis.call('SET', KEYS[1], ARGV[7], 'PX', ARGV[1])
local f = {'id', ARGV[2], 'name', ARGV[3], 'payload', ARGV[4]}
if ARGV[5] ~= nil and ARGV[5] ~= '' then
  f[#f + 1] = 'sig'
  f[#f + 1] = ARGV[5]
end
if ARGV[6] ~= nil and ARGV[6] ~= '' then
  f[#f + 1] = 'headers'
  f[#f + 1] = ARGV[6]
end
return redis.call('XADD', KEYS[2], '*', unpack(f)) and 1
