-- claim.lua: claim a batch's idempotency keys in one call.
-- KEYS   idempotency:notify:<id> of each row to claim (all in one hash slot)
-- ARGV[1] our claim value; ARGV[2] claim TTL in ms
-- returns, per key in KEYS order: nil when the key was absent and now holds
-- our claim; the value found otherwise (a delivered mark "1:<fingerprint>",
-- a claim, or anything else), which is left unchanged; for a bare "1" (the
-- mark of earlier versions) the pair {"1", its PTTL in ms}, so the caller
-- can tell when it was written; or the error Redis gave for that key alone
-- (WRONGTYPE).
local out = {}
for i, key in ipairs(KEYS) do
  local v = redis.pcall('SET', key, ARGV[1], 'PX', ARGV[2], 'NX', 'GET')
  if v == '1' then
    v = {v, redis.call('PTTL', key)}
  end
  out[i] = v
end
return out
