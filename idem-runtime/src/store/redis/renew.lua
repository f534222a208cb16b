-- renew: extend the lease of a claim that runs long, if the fence still owns the record; the
-- recovery point stays as it is.
-- ARGV: scope, key, fence, lease ms.
-- Returns {1} done | {2} fence lost | {0, why the key is not an idem record}.
local rec, why = load(ARGV[1], ARGV[2])
if rec == false then
  return {0, why}
end
if rec == nil or rec.fence_text ~= ARGV[3] or rec.state ~= 'in_progress' then
  return {2}
end
redis.call('HSET', KEYS[1], 'meta',
  meta('in_progress', rec.fence_text, now_ms() + tonumber(ARGV[4]), '-', '-'))
return {1}
