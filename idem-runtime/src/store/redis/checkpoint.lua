-- checkpoint: record how far the side effect got and renew the lease, if the fence still owns
-- the record.
-- ARGV: identity, fence, recovery point, lease ms.
-- Returns {1} done | {2} fence lost | {0, why the key is not an idem record}.
local rec, why = load()
if rec == false then
  return {0, why}
end
if rec == nil or rec.fence_text ~= ARGV[2] or rec.state ~= 'i' then
  return {2}
end
redis.call('SET', KEYS[1],
  header('i', rec.fence_text, now_ms() + tonumber(ARGV[4]), rec.attempt, '-', '-', #ARGV[1],
    #ARGV[3], 0) .. ARGV[1] .. fp_of(rec) .. ARGV[3],
  'KEEPTTL')
return {1}
