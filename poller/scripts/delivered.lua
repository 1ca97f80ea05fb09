-- delivered.lua: after a successful send, turn our claim into the delivered mark.
-- KEYS[1] idempotency:notify:<id>
-- ARGV[1] our claim value; ARGV[2] delivered TTL in ms (24 h)
-- returns 1 the key now says delivered; 0 another runner's claim is there (left alone).
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or v == false then
  -- false: our claim expired during a slow send; we did deliver, so say so.
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
  return 1
end
if v == '1' then
  return 1
end
return 0
