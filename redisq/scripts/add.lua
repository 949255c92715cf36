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
-- KEYS[1]  stream key               (<prefix>q:{<queue>}:stream)
-- KEYS[2]  dedupe marks, a hash     (<prefix>q:{<queue>}:dedupe:marks)
-- KEYS[3]  dedupe expiry, a zset    (<prefix>q:{<queue>}:dedupe:expiry)
-- ARGV[1]  dedupe TTL in milliseconds (integer > 0)
-- ARGV[2]  "" to add (Add), or the re-add's token, unique per Readd call
-- ARGV[3 + 5(i-1) .. 7 + 5(i-1)]  job i's id (not ""), name, payload
--          (bytes), signature ("" = none: no sig field) and headers (a JSON
--          object of strings; "" = none: no headers field)
--
-- A job's mark is its field in the hash and its member in the zset, whose
-- score is the Unix time in ms at which the mark expires; an expired mark
-- counts as absent. First the call deletes expired marks, at most
-- 2 × jobs + 16 of them (the oldest first), so that the two keys stay as
-- large as the marks alive (the trim deletes those of acknowledged jobs),
-- and makes sure of the placeholder member "" (hash value "", score +inf),
-- which keeps both keys in existence: a key that does not exist yet is
-- what makes a script wait for a whole slot migration on a Redis Cluster.
--
-- Per job, to add: unless it has a live mark (then it is a duplicate and
-- nothing is added), mark it "1" until now + ttl. To re-add: unless its mark
-- holds this call's token (a resend of the same call's command: the job
-- counts as added, and nothing is added again), mark it with the token until
-- now + ttl. Then XADD <stream> * id .. name .. payload .. [sig ..]
-- [headers ..].
--
-- Returns  {added, failed, err}: added = how many jobs were added; failed = 0
--          when every job was handled, else the index i of the job whose
--          XADD failed (an add deletes its mark again, so that a retry is
--          not mistaken for a duplicate; a re-add sets it back to "1",
--          without its token, so that a resend tries the XADD again) and err
--          its error reply; the jobs after it were not tried.
local token = ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = now + tonumber(ARGV[1])
local jobs = (#ARGV - 2) / 5

local old = redis.call('ZRANGE', KEYS[3], '-inf', now, 'BYSCORE', 'LIMIT', 0, 2 * jobs + 16)
if #old > 0 then
  redis.call('HDEL', KEYS[2], unpack(old))
  redis.call('ZREM', KEYS[3], unpack(old))
end
redis.call('HSETNX', KEYS[2], '', '')
redis.call('ZADD', KEYS[3], 'NX', '+inf', '')

local added = 0
for i = 1, jobs do
  local a = 3 + 5 * (i - 1)
  local id = ARGV[a]
  local new = false
  if token == '' then
    -- Expired marks older than the ones deleted above may remain: their
    -- score says whether they count.
    local exp = redis.call('ZSCORE', KEYS[3], id)
    new = (not exp) or tonumber(exp) <= now
    if new then
      redis.call('HSET', KEYS[2], id, '1')
    end
  elseif redis.call('HGET', KEYS[2], id) == token then
    added = added + 1 -- this call re-added it already
  else
    new = true
    redis.call('HSET', KEYS[2], id, token)
  end
  if new then
    redis.call('ZADD', KEYS[3], until_ms, id)
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
        redis.call('HDEL', KEYS[2], id)
        redis.call('ZREM', KEYS[3], id)
      else
        -- Not this call's token any more: a resend of the call must try
        -- the XADD again, not count the job as re-added.
        redis.call('HSET', KEYS[2], id, '1')
      end
      return {added, i, r.err}
    end
    added = added + 1
  end
end
return {added, 0, ''}
