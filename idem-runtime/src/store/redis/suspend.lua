-- suspend: keep the claim in progress after an outcome that may have had its effect, if the
-- fence still owns the record: its lease ends now (the same request's retry resumes it at
-- once), the note says why, a resumable claim is due to the completer after the delay, and the
-- record holds unfinished work (format 3, no expiry) until it is finished or released.
-- ARGV: identity, fence, note, resume delay ms.
-- Returns {1, resume_at or false when it stores no request} done | {2} fence lost
--       | {0, why the key is not an idem record}.
local rec, why = load()
if rec == false then
  return {0, why}
end
if rec == nil or rec.fence_text ~= ARGV[2] or rec.state ~= 'i' then
  return {2}
end
local now = now_ms()
local r = parts(rec)
r.lease_until, r.note = now, ARGV[3]
if r.request then
  r.resume_at = now + tonumber(ARGV[4])
end
put(r, rec)
return {1, r.resume_at or false}
