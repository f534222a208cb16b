-- release: give the claim up so that a retry can claim, if the fence still owns it. The record
-- stays (as released) until its retention ends, so that fences keep growing.
-- ARGV: scope, key, fence.
-- Returns {1} done | {2} fence lost | {0, why the key is not an idem record}.
local rec, why = load(ARGV[1], ARGV[2])
if rec == false then
  return {0, why}
end
if rec == nil or rec.fence_text ~= ARGV[3] or rec.state ~= 'in_progress' then
  return {2}
end
redis.call('HSET', KEYS[1], 'meta', meta('released', rec.fence_text, rec.lease_text, '-', '-'))
return {1}
