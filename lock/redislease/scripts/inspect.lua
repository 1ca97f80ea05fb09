-- inspect.lua: read-only view of a lock for Holder and LastToken (/status).
-- KEYS[1] lock key; KEYS[2] fence counter; KEYS[3] holder record
-- ARGV: none
-- returns {owner, pttl, lockProblem, counter, fenceProblem, instance}: owner ''
-- and pttl -2 when free; counter '0' when absent; a problem is '' or what the
-- key holds that acquire.lua would refuse (the same checks, so /status and
-- Acquire agree); instance the holder's, '' when unknown.
local lp = lockProblem(KEYS[1], true)
local fp = fenceProblem(KEYS[2])
local owner, counter = '', '0'
if not lp and redis.call('TYPE', KEYS[1]).ok == 'string' then
  owner = redis.call('GET', KEYS[1])
end
if not fp then
  counter = redis.call('GET', KEYS[2]) or '0'
end
return {owner, redis.call('PTTL', KEYS[1]), lp or '', counter, fp or '', holderInstance(KEYS[3], owner)}
