-- presence.lua: register or refresh one live consumer process in the
-- queue's presence set, and say who else holds the same consumer name.
--
-- KEYS[1]  presence set (<prefix>q:{<queue>}:consumers), a sorted set:
--          member "<group>\0<name>\0<instance>", score = when it expires
--          (Unix ms, Redis clock)
-- ARGV[1]  group
-- ARGV[2]  instance id (unique per process)
-- ARGV[3]  ttl in ms (integer > 0): the member expires this long from now
-- ARGV[4]  mode: "beat" (ARGV[5] is the name: register it, whoever else
--          holds it) or "claim" (ARGV[5] is a base: register the first of
--          "<base>-0" … "<base>-<ARGV[6]-1>" no other live instance of the
--          group holds)
-- ARGV[5]  name or base
-- ARGV[6]  (claim) how many names to try (integer > 0)
--
-- Expired members are removed first, so "live" means refreshed within its
-- ttl. The clock is Redis's (TIME; Redis 7 replicates a script's effects,
-- so reading it is allowed). The set's own expiry is pushed to at least
-- the ttl, so it vanishes once every member is gone.
--
-- Returns  beat: the other live members of the group with the same name, as
--          a flat list instance id, expiry (Unix ms, a string), … (empty
--          when the name is this process's alone);
--          claim: the name registered, or false when all were taken.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local group, inst, ttl, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local prefix = group .. '\0'

-- holders maps each name of the group to the other instances holding it,
-- each followed by its expiry.
local holders = {}
local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #members, 2 do
  local m, score = members[i], members[i + 1]
  if string.sub(m, 1, #prefix) == prefix then
    local rest = string.sub(m, #prefix + 1)
    local sep = string.find(rest, '\0', 1, true)
    if sep then
      local name, who = string.sub(rest, 1, sep - 1), string.sub(rest, sep + 1)
      if who ~= inst then
        holders[name] = holders[name] or {}
        table.insert(holders[name], who)
        table.insert(holders[name], score)
      end
    end
  end
end

local function register(name)
  redis.call('ZADD', KEYS[1], now + ttl, prefix .. name .. '\0' .. inst)
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
end

if mode == 'beat' then
  register(ARGV[5])
  return holders[ARGV[5]] or {}
end
for i = 0, tonumber(ARGV[6]) - 1 do
  local name = ARGV[5] .. '-' .. i
  if not holders[name] then
    register(name)
    return name
  end
end
return false
