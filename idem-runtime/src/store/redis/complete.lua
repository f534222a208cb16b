-- complete: store the response and mark the record completed, if the fence still owns it.
-- ARGV: scope, key, fence, status ('-' for none), '1' for a final error else '0', body.
-- Returns {1} done | {2} fence lost | {0, why the key is not an idem record}.
-- A key that exists is within its retention: no clock is needed.
local rec, why = load(ARGV[1], ARGV[2])
if rec == false then
  return {0, why}
end
if rec == nil or rec.fence_text ~= ARGV[3] then
  return {2}
end
if rec.state == 'completed' then
  -- A retry of a completion whose reply was lost: done already, by this fence, with this answer.
  if rec.status == ARGV[4] and rec.error == ARGV[5] and rec.body == ARGV[6] then
    return {1}
  end
  return {2}
end
if rec.state ~= 'in_progress' then
  return {2}
end
redis.call('HSET', KEYS[1], 'meta',
  meta('completed', rec.fence_text, rec.lease_text, ARGV[4], ARGV[5]), 'body', ARGV[6])
if rec.recovery then
  redis.call('HDEL', KEYS[1], 'recovery')
end
return {1}
