-- acquire.lua: take the lock if free and issue the next fencing token.
-- KEYS[1] lock key; KEYS[2] fence counter (same hash slot: fence:{<lock key>});
-- KEYS[3] holder record (same slot: holder:{<lock key>}), a hash {owner, instance}
-- ARGV[1] owner (fresh UUID); ARGV[2] TTL in ms; ARGV[3] floor (highest token
--         accepted downstream, so the counter never goes back after data loss;
--         a non-negative decimal below 2^63-1); ARGV[4] instance (who acquires,
--         for operators; may be '')
-- returns {token, 0, '', ''} when acquired ({token, 1, '', ''} when the floor had to lift the
-- counter: Redis lost its state, and an earlier holder may still be acting);
-- {'0', pttl, owner, instance} of the current holder when not (instance '' when
-- its record is not the holder's). token is a decimal string (exact over int64;
-- Lua numbers are doubles).
-- error 'CORRUPT lock|fence <key> holds <what>' when the lock key is not a
-- string with an expiry or the counter is not an integer INCR can advance;
-- nothing is written then: every check comes before the first write.
local problem = lockProblem(KEYS[1], true)
if problem then
  return corrupt('lock', KEYS[1], problem)
end
problem = fenceProblem(KEYS[2])
if problem then
  return corrupt('fence', KEYS[2], problem)
end

if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local owner = redis.call('GET', KEYS[1])
  return {'0', redis.call('PTTL', KEYS[1]), owner, holderInstance(KEYS[3], owner)}
end
-- The holder record only describes the lock: one of another type is replaced.
if redis.call('TYPE', KEYS[3]).ok ~= 'hash' then
  redis.call('DEL', KEYS[3])
end
redis.call('HSET', KEYS[3], 'owner', ARGV[1], 'instance', ARGV[4])
redis.call('INCR', KEYS[2])
local token = redis.call('GET', KEYS[2])
if below(ARGV[3], token) then
  return {token, 0, '', ''}
end
-- Redis does the arithmetic: SET then INCR keeps the counter an exact integer.
redis.call('SET', KEYS[2], ARGV[3])
redis.call('INCR', KEYS[2])
return {redis.call('GET', KEYS[2]), 1, '', ''}
