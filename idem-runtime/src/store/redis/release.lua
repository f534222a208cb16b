-- release: give the claim up so that a retry can claim, if the fence still owns it. The record
-- stays (as released) until its retention ends, so that fences keep growing; the work it held
-- (its stored request, its note) goes.
-- ARGV: identity, fence.
-- Returns {1} done | {2} fence lost | {0, why the key is not an idem record}.
local rec, why = load()
if rec == false then
  return {0, why}
end
if rec == nil or rec.fence_text ~= ARGV[2] or rec.state ~= 'i' then
  return {2}
end
local r = parts(rec)
r.state, r.request, r.note, r.resume_at = 'r', nil, nil, nil
put(r, rec)
return {1}
