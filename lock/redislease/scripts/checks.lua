-- checks.lua: helpers prepended to every other script by lock.go; not a
-- script of its own. They describe a key holding something the scripts
-- cannot have written, so the scripts can refuse before their first write
-- (Redis does not roll a script back: a write before a failing call stays).
-- KEYS / ARGV: none (the functions take the keys as arguments)
-- returns: nothing; defines below, shown, corrupt, lockProblem, fenceProblem,
-- holderInstance.

-- MAX_TOKEN is the largest counter value INCR can take without overflow.
local MAX_TOKEN = '9223372036854775806'

-- below: a < b for canonical non-negative decimal strings, exact beyond 2^53
-- (Lua numbers are doubles; tokens are compared as text instead).
local function below(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

-- shown: a string key's value for an error message: at most 64 bytes,
-- control, quote and non-ASCII bytes escaped, the full length when cut.
local function shown(key)
  local n = redis.call('STRLEN', key)
  local s = string.gsub(redis.call('GETRANGE', key, 0, 63), '[%c"\\\128-\255]',
    function(c) return string.format('\\x%02x', string.byte(c)) end)
  if n > 64 then
    return 'the string "' .. s .. '..." (' .. n .. ' bytes)'
  end
  return 'the string "' .. s .. '"'
end

-- corrupt: the error reply lock.go turns into lock.ErrCorrupt.
local function corrupt(role, key, what)
  return redis.error_reply('CORRUPT ' .. role .. ' ' .. key .. ' holds ' .. what)
end

-- lockProblem: nil when the lock key is absent or a string (with an expiry,
-- when needExpiry: a lease without one never frees); else what it holds.
local function lockProblem(key, needExpiry)
  local t = redis.call('TYPE', key).ok
  if t == 'none' then
    return nil
  end
  if t ~= 'string' then
    return 'a ' .. t
  end
  if needExpiry and redis.call('PTTL', key) == -1 then
    return shown(key) .. ' with no expiry'
  end
  return nil
end

-- fenceProblem: nil when the counter is absent or a string INCR can advance:
-- '0' or a base-10 integer without sign or leading zero, at most MAX_TOKEN;
-- else what it holds.
local function fenceProblem(key)
  local t = redis.call('TYPE', key).ok
  if t == 'none' then
    return nil
  end
  if t ~= 'string' then
    return 'a ' .. t
  end
  if redis.call('STRLEN', key) <= #MAX_TOKEN then
    local v = redis.call('GET', key)
    if v == '0' or (string.find(v, '^[1-9]%d*$') and not below(MAX_TOKEN, v)) then
      return nil
    end
  end
  return shown(key)
end


-- holderInstance: the instance the holder record names when it describes
-- owner (the record is overwritten at each acquisition and never trusted
-- for another owner); '' otherwise, or when the record is not a hash.
local function holderInstance(key, owner)
  if not owner or owner == '' or redis.call('TYPE', key).ok ~= 'hash' then
    return ''
  end
  local rec = redis.call('HMGET', key, 'owner', 'instance')
  if rec[1] == owner and rec[2] then
    return rec[2]
  end
  return ''
end
