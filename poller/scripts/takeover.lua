-- takeover.lua: replace what an idempotency key holds with our claim, only
-- if it is still exactly the value seen (compare-and-set): an earlier
-- holder's claim, or a delivered mark left by an earlier row with the same
-- id. A claim its holder turned into this row's mark meanwhile is never
-- overwritten.
-- KEYS[1] idempotency:notify:<id>
-- ARGV[1] the value seen; ARGV[2] our claim; ARGV[3] claim TTL in ms;
-- ARGV[4] this row's delivered mark "1:<fingerprint>"
-- returns 1 taken over; 2 the key now holds this row's mark (delivered);
-- 0 it changed otherwise (left alone).
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if v == ARGV[4] then
  return 2
end
return 0
