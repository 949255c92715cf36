-- readd.lua: add a batch of jobs to the queue stream again, whatever their
-- dedupe keys say (the re-drive of jobs whose stream entries may be gone
-- while their dedupe keys are still there: a FLUSHALL followed by a re-add,
-- an XDEL, a failover to a replica that had the key but not the entry, …),
-- in order, in one atomic call (add.lua says why one call). The receiver's
-- inbox drops a copy if it already has the job.
--
-- KEYS and ARGV as in add.lua: KEYS[1] the stream, KEYS[1 + i] job i's
-- dedupe key; ARGV[1] the dedupe TTL (ms), then five arguments per job (id,
-- name, payload, signature, headers; "" = none).
--
-- Per job: SET <dedupe key> 1 PX ttl (overwriting), then XADD <stream> *
-- id .. name .. payload .. [sig ..] [headers ..].
--
-- Returns  {added, failed, err}: added = how many jobs were added; failed = 0
--          when all were, else the index i of the job whose XADD failed (its
--          dedupe key left set: a later plain add of the id is a no-op, a
--          later re-add adds it; the jobs after it not tried) and err its
--          error reply.
local added = 0
for i = 1, #KEYS - 1 do
  local a = 2 + 5 * (i - 1)
  redis.call('SET', KEYS[1 + i], '1', 'PX', ARGV[1])
  local f = {'id', ARGV[a], 'name', ARGV[a + 1], 'payload', ARGV[a + 2]}
  if ARGV[a + 3] ~= '' then
    f[#f + 1] = 'sig'
    f[#f + 1] = ARGV[a + 3]
  end
  if ARGV[a + 4] ~= '' then
    f[#f + 1] = 'headers'
    f[#f + 1] = ARGV[a + 4]
  end
  local r = redis.pcall('XADD', KEYS[1], '*', unpack(f))
  if type(r) == 'table' and r.err then
    return {added, i, r.err}
  end
  added = added + 1
end
return {added, 0, ''}
