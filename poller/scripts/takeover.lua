-- takeover.lua: replace an earlier holder's claim with ours, only if it is
-- still exactly that claim (compare-and-set), so a claim its holder turned
-- into the delivered mark meanwhile is never overwritten.
-- KEYS[1] idempotency:notify:<id>
-- ARGV[1] the claim seen; ARGV[2] our claim; ARGV[3] claim TTL in ms
-- returns 1 taken over; 2 the key now says delivered; 0 it changed otherwise (left alone).
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if v == '1' then
  return 2
end
return 0
