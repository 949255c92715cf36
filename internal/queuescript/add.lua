-- add.lua: add a batch of jobs to the queue stream, in order, in one atomic
-- call: idempotently (Add), or again whatever the dedupe marks say (Readd,
-- the re-drive of jobs whose entries may be gone while their dedupe marks are
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
-- KEYS[1]  stream key                  (<prefix>q:{<queue>}:stream)
-- KEYS[2]  dedupe marks, a sorted set  (<prefix>q:{<queue>}:dedupe)
-- KEYS[3]  re-add tokens, a hash       (<prefix>q:{<queue>}:dedupe-tokens)
-- ARGV[1]  dedupe TTL in milliseconds (integer > 0)
-- ARGV[2]  "" to add (Add), or the re-add's token, unique per Readd call
-- ARGV[3 + 5(i-1) .. 7 + 5(i-1)]  job i's id (not "": refused, as an XADD
--          failure of that job), name, payload
--          (bytes), signature ("" = none: no sig field) and headers (a JSON
--          object of strings; "" = none: no headers field)
--
-- A job's dedupe mark is its member in the sorted set, scored with the Unix
-- time in ms at which it expires; an expired mark counts as absent (the
-- trim deletes expired marks). The placeholder "" (score +inf, and a field
-- "" in the hash) keeps both keys in existence once the queue was used: a
-- key that does not exist yet is what makes a script wait for a whole slot
-- migration on a Redis Cluster.
--
-- Per job, to add: ZADD NX of its mark until now + ttl; when the mark
-- existed and has not expired the job is a duplicate and nothing is added
-- (an expired one is renewed). To re-add: unless its token field holds this
-- call's token (a resend of the same call's command: the job counts as
-- added, and nothing is added again), set the field to the token and the
-- mark until now + ttl. Then XADD <stream> * id .. name .. payload ..
-- [sig ..] [headers ..].
--
-- Returns  {added, failed, err}: added = how many jobs were added; failed = 0
--          when every job was handled, else the index i of the job whose
--          XADD failed (an add deletes its mark again, so that a retry is
--          not mistaken for a duplicate; a re-add deletes its token, so
--          that a resend tries the XADD again) and err its error reply; the
--          jobs after it were not tried.
local token = ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = now + tonumber(ARGV[1])
redis.call('ZADD', KEYS[2], 'NX', '+inf', '')
redis.call('HSETNX', KEYS[3], '', '')

local added = 0
for i = 1, (#ARGV - 2) / 5 do
  local a = 3 + 5 * (i - 1)
  local id = ARGV[a]
  local new = false
  if id == '' then
    -- "" is the placeholder: a job of that id would overwrite it.
    return {added, i, 'ERR empty job id'}
  end
  if token == '' then
    new = redis.call('ZADD', KEYS[2], 'NX', until_ms, id) == 1
    if not new and tonumber(redis.call('ZSCORE', KEYS[2], id)) <= now then
      redis.call('ZADD', KEYS[2], until_ms, id) -- expired: counts as absent
      new = true
    end
  elseif redis.call('HGET', KEYS[3], id) == token then
    added = added + 1 -- this call re-added it already
  else
    new = true
    redis.call('HSET', KEYS[3], id, token)
    redis.call('ZADD', KEYS[2], until_ms, id)
  end
  if new then
    local f = {'id', id, 'name', ARGV[a + 1], 'payload', ARGV[a + 2]}
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
        redis.call('ZREM', KEYS[2], id)
      else
        -- Not this call's token any more: a resend of the call must try
        -- the XADD again, not count the job as re-added.
        redis.call('HDEL', KEYS[3], id)
      end
      return {added, i, r.err}
    end
    added = added + 1
  end
end
return {added, 0, ''}
