-- unclaim.lua: drop our claim after a failed or skipped send, so nothing blocks the retry.
-- KEYS[1] idempotency:notify:<id>
-- ARGV[1] our claim value
-- returns 1 deleted; 0 the key is not our claim (gone, delivered, or another's).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
