-- raise.lua: Redlock second round; lift this node's fence counter to the token
-- chosen across the quorum, so any later majority sees at least that token.
-- KEYS[1] lock key; KEYS[2] fence counter
-- ARGV[1] owner; ARGV[2] token
-- returns 1 when the owner still holds the lock here (counter raised), 0 otherwise.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
