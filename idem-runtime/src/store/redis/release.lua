-- release: give the claim up so that a retry can claim, if the fence still owns it. The record
-- stays (as released) until its retention ends, so that fences keep growing.
-- ARGV: identity, fence.
-- Returns {1} done | {2} fence lost | {0, why the key is not an idem record}.
local rec, why = load()
if rec == false then
  return {0, why}
end
if rec == nil or rec.fence_text ~= ARGV[2] or rec.state ~= 'i' then
  return {2}
end
redis.call('SET', KEYS[1],
  header('r', rec.fence_text, rec.lease_text, rec.attempt, '-', '-', #ARGV[1],
    rec.rlen, 0) .. string.sub(rec.v, rec.fp_at - #ARGV[1], rec.body_at - 1),
  'KEEPTTL')
return {1}
