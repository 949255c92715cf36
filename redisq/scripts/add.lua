-- add.lua: idempotent add of a batch of jobs to the queue stream, in order,
-- in one atomic call.
--
-- One call per batch, not one per job: a pipeline of per-job calls can have
-- a failed prefix and a successful suffix (NOSCRIPT until another client
-- loads the script, LOADING until a restarted server has read its data, both
-- seen when a large pipeline is read in two parts), and the retry of the
-- prefix then lands in the stream after the suffix: a chat's seqs out of
-- order. A script runs whole or not at all, and stops at the first job that
-- fails, so what it adds is always a prefix of the batch.
--
-- KEYS[1]      stream key                     (<prefix>q:{<queue>}:stream)
-- KEYS[1 + i]  dedupe key of job i, i = 1..n  (<prefix>q:{<queue>}:dedupe:<job id>)
-- ARGV[1]      dedupe TTL in milliseconds (integer > 0)
-- ARGV[2 + 5(i-1) .. 6 + 5(i-1)]  job i's id, name, payload (bytes),
--              signature ("" = none: no sig field) and headers (a JSON
--              object of strings; "" = none: no headers field)
--
-- Per job: SET <dedupe key> 1 NX PX ttl; when it was set, XADD <stream> *
-- id .. name .. payload .. [sig ..] [headers ..]; when the key already
-- existed the job is a duplicate and nothing is added.
--
-- Returns  {added, failed, err}: added = how many jobs were new; failed = 0
--          when every job was handled, else the index i of the job whose
--          XADD failed (its dedupe key deleted again, so that a retry is not
--          mistaken for a duplicate; the jobs after it not tried) and err its
--          error reply.
local added = 0
for i = 1, #KEYS - 1 do
  local a = 2 + 5 * (i - 1)
  if redis.call('SET', KEYS[1 + i], '1', 'NX', 'PX', ARGV[1]) then
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
      redis.call('DEL', KEYS[1 + i])
      return {added, i, r.err}
    end
    added = added + 1
  end
end
return {added, 0, ''}
