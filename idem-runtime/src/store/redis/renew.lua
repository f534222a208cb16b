-- renew: extend the lease of a claim that runs long, if the fence still owns the record; the
-- recovery point stays as it is.
-- ARGV: identity, fence, lease ms.
-- Returns {1} done | {2} fence lost | {0, why the key is not an idem record}.
local rec, why = load()
if rec == false then
  return {0, why}
end
if rec == nil or rec.fence_text ~= ARGV[2] or rec.state ~= 'i' then
  return {2}
end
local r = parts(rec)
r.lease_until = now_ms() + tonumber(ARGV[3])
put(r, rec)
return {1}
