-- extend.lua: owner-checked renewal. Never a bare PEXPIRE.
-- KEYS[1] lock key
-- ARGV[1] owner; ARGV[2] TTL in ms
-- returns 1 extended; 0 the key is gone (expired or flushed); -1 someone else owns it;
-- error 'CORRUPT lock <key> holds <what>' when the key is not a string.
local problem = lockProblem(KEYS[1], false)
if problem then
  return corrupt('lock', KEYS[1], problem)
end
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if v == false then
  return 0
end
return -1
