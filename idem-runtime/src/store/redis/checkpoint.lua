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
local r = parts(rec)
r.recovery, r.lease_until = ARGV[3], now_ms() + tonumber(ARGV[4])
put(r, rec)
return {1}
