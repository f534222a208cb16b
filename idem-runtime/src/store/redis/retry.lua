-- retry: the operator's retry of parked work. The record is in progress again with its lease
-- run out now, its attempts counted afresh (the number back to 1), its note kept; a stored
-- request makes it due to the completer now.
-- ARGV: identity.
-- Returns {1} no record | {2, state} not parked | {3, fence, now ms, 1 if its request is
--         stored else 0} | {0, why the key is not an idem record}.
local rec, why = load()
if rec == false then
  return {0, why}
end
if rec == nil then
  return {1}
end
if rec.state ~= 'p' then
  return {2, rec.state}
end
local now = now_ms()
local r = parts(rec)
r.state, r.lease_until, r.attempt = 'i', now, 1
if r.request then
  r.resume_at = now
end
put(r, rec)
return {3, rec.fence, now, r.request and 1 or 0}
