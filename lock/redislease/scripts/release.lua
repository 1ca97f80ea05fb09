-- release.lua: owner-checked delete, then wake waiters. Never a bare DEL.
-- KEYS[1] lock key
-- ARGV[1] owner; ARGV[2] pub/sub channel told about the release
-- returns 1 released; 0 the key is gone (expired or flushed); -1 someone else owns it;
-- error 'CORRUPT lock <key> holds <what>' when the key is not a string.
local problem = lockProblem(KEYS[1], false)
if problem then
  return corrupt('lock', KEYS[1], problem)
end
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
if v == false then
  return 0
end
return -1
