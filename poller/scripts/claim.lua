-- claim.lua: claim a batch's idempotency keys in one call.
-- KEYS   idempotency:notify:<id> of each row to claim (all in one hash slot)
-- ARGV[1] our claim value; ARGV[2] claim TTL in ms
-- returns, per key in KEYS order: nil when the key was absent and now holds
-- our claim; the value found otherwise (the delivered mark "1", a claim, or
-- anything else), which is left unchanged; or the error Redis gave for that
-- key alone (WRONGTYPE).
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.pcall('SET', key, ARGV[1], 'PX', ARGV[2], 'NX', 'GET')
end
return out
