-- add.lua: add a batch of jobs to the queue stream, in order, in one atomic
-- call: idempotently (Add), or again whatever the dedupe keys say (Readd,
-- the re-drive of jobs whose entries may be gone while their dedupe keys are
-- still there: a FLUSHALL followed by a re-add, an XDEL, a failover to a
-- replica that had the key but not the entry, …).
--
-- One call per batch, not one per job: a pipeline of per-job calls can have
-- a failed prefix and a successful suffix (NOSCRIPT until another client
-- loads the script, LOADING until a restarted server has read its data,
-- both seen when a large pipeline is read in two parts), and the retry of
-- the prefix then lands in the stream after the suffix: a chat's seqs out
-- of order. A script's call either runs or (NOSCRIPT, LOADING, TRYAGAIN, a
-- key the ACL refuses) does not start, and a running script stops at the
-- first job that fails, so what it adds is always a prefix of the batch. On a Redis
-- Cluster every key is in the queue's slot ({<queue>} hash tag).
--
-- KEYS[1]      stream key                     (<prefix>q:{<queue>}:stream)
-- KEYS[1 + i]  dedupe key of job i, i = 1..n  (<prefix>q:{<queue>}:dedupe:<job id>)
-- ARGV[1]      dedupe TTL in milliseconds (integer > 0)
-- ARGV[2]      "" to add (Add), or the re-add's token, unique per Readd call
-- ARGV[3 + 5(i-1) .. 7 + 5(i-1)]  job i's id, name, payload (bytes),
--              signature ("" = none: no sig field) and headers (a JSON
--              object of strings; "" = none: no headers field)
--
-- Per job, to add: SET <dedupe key> 1 NX PX ttl; when the key already
-- existed the job is a duplicate and nothing is added. To re-add: unless
-- the dedupe key holds this call's token (a resend of the same call's
-- command: the job counts as added, and nothing is added again), SET
-- <dedupe key> <token> PX ttl. Then XADD <stream> * id .. name .. payload
-- .. [sig ..] [headers ..].
--
-- Returns  {added, failed, err}: added = how many jobs were added; failed = 0
--          when every job was handled, else the index i of the job whose
--          XADD failed (an add deletes its dedupe key again, so that a retry
--          is not mistaken for a duplicate; a re-add sets it back to 1,
--          without its token, so that a resend tries the XADD again) and err
--          its error reply; the jobs after it were not tried.
local token = ARGV[2]
local added = 0
for i = 1, #KEYS - 1 do
  local a = 3 + 5 * (i - 1)
  local new
  if token == '' then
    new = redis.call('SET', KEYS[1 + i], '1', 'NX', 'PX', ARGV[1])
  elseif redis.call('GET', KEYS[1 + i]) == token then
    added = added + 1 -- this call re-added it already
  else
    new = redis.call('SET', KEYS[1 + i], token, 'PX', ARGV[1])
  end
  if new then
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
      if token == '' then
        redis.call('DEL', KEYS[1 + i])
      else
        -- Not this call's token any more: a resend of the call must try
        -- the XADD again, not count the job as re-added.
        redis.call('SET', KEYS[1 + i], '1', 'PX', ARGV[1])
      end
      return {added, i, r.err}
    end
    added = added + 1
  end
end
return {added, 0, ''}
