-- force_release: the operator's release of a claim stuck in progress, or of parked work. The record becomes
-- released and its fence moves on, so the owner presumed gone cannot complete, release or
-- checkpoint over the next attempt if it wakes up.
-- ARGV: identity, the fence the operator saw ('' for whatever claim is in progress).
-- Returns {1} no record | {2, state} neither in progress nor parked | {3, new fence}
--       | {4, state, fence} the record's fence is not the one asked for: nothing changed
--       | {0, why the key is not an idem record}.
local rec, why = load()
if rec == false then
  return {0, why}
end
if rec == nil then
  return {1}
end
-- Compared as text: both are the decimal digits of the fence.
if ARGV[2] ~= '' and rec.fence_text ~= ARGV[2] then
  return {4, rec.state, rec.fence_text}
end
if rec.state ~= 'i' and rec.state ~= 'p' then
  return {2, rec.state}
end
local fence = rec.fence + 1
local r = parts(rec)
r.state, r.fence, r.request, r.note, r.resume_at = 'r', fence, nil, nil, nil
put(r, rec)
return {3, fence}
