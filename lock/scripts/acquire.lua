-- acquire.lua: take the lock if free and issue the next fencing token.
-- KEYS[1] lock key; KEYS[2] fence counter (same hash slot: fence:{<lock key>})
-- ARGV[1] owner (fresh UUID); ARGV[2] TTL in ms; ARGV[3] floor (highest token
--         accepted downstream, so the counter never goes back after data loss)
-- returns {token, 0, ''} when acquired ({token, 1, ''} when the floor had to lift the
-- counter: Redis lost its state, and an earlier holder may still be acting);
-- {0, pttl, owner} of the current holder when not.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local token = redis.call('INCR', KEYS[2])
  local floor = tonumber(ARGV[3])
  if token <= floor then
    token = floor + 1
    redis.call('SET', KEYS[2], token)
    return {token, 1, ''}
  end
  return {token, 0, ''}
end
return {0, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1]) or ''}
