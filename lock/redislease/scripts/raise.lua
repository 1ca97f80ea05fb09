-- raise.lua: Redlock second round; lift this node's fence counter to the token
-- chosen across the quorum, so any later majority sees at least that token.
-- KEYS[1] lock key; KEYS[2] fence counter
-- ARGV[1] owner; ARGV[2] token (decimal)
-- returns 1 when the owner still holds the lock here (counter raised), 0 otherwise;
-- error 'CORRUPT lock|fence <key> holds <what>' when a key holds something
-- acquire.lua cannot have written (nothing is written then).
local problem = lockProblem(KEYS[1], false)
if problem then
  return corrupt('lock', KEYS[1], problem)
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
problem = fenceProblem(KEYS[2])
if problem then
  return corrupt('fence', KEYS[2], problem)
end
if below(redis.call('GET', KEYS[2]) or '0', ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
