-- finish.lua: after a batch's sends, settle its idempotency keys in one call.
-- KEYS   idempotency:notify:<id> of each row to settle (all in one hash slot)
-- ARGV[1] our claim value; ARGV[2] delivered TTL in ms (24 h);
-- ARGV[3] one letter per key, in KEYS order:
--   d  sent: our claim becomes the row's delivered mark; so does a missing
--      key (our claim expired during a slow send, and we did deliver)
--   u  not delivered: our claim is dropped, so nothing blocks the retry
-- ARGV[3+i] the delivered mark of KEYS[i], "1:<fingerprint>" ("" for u).
-- A key holding anything else (another runner's claim, a delivered mark, a
-- value of another type) is left alone.
-- returns how many keys changed.
local claim, ttl, ops = ARGV[1], ARGV[2], ARGV[3]
local n = 0
for i, key in ipairs(KEYS) do
  local v = redis.pcall('GET', key)
  if type(v) ~= 'table' then -- a table is an error reply: WRONGTYPE, left alone
    local op = string.sub(ops, i, i)
    if op == 'd' and (v == claim or v == false) then
      redis.call('SET', key, ARGV[3 + i], 'PX', ttl)
      n = n + 1
    elseif op == 'u' and v == claim then
      redis.call('DEL', key)
      n = n + 1
    end
  end
end
return n
