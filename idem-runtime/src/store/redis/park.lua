-- park: give up unfinished work whose attempts ran out, if the record is still in progress
-- under the fence it was found due with and its lease ran out: parked with the note, never run
-- again by itself nor expired, until an operator retries or releases it.
-- ARGV: identity, fence, note.
-- Returns {1} done | {2} fence lost | {0, why the key is not an idem record}.
local rec, why = load()
if rec == false then
  return {0, why}
end
if rec == nil or rec.fence_text ~= ARGV[2] or rec.state ~= 'i'
    or rec.lease_until > now_ms() then
  return {2}
end
local r = parts(rec)
r.state, r.note, r.resume_at = 'p', ARGV[3], nil
put(r, rec)
return {1}
