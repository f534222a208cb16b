-- begin: claim, replay, in progress, key reused, parked, or take over; one atomic step. The
-- script is begin_fast.lua, then record.lua, then this file.
-- ARGV: identity, fingerprint, lease ms, retain ms, '1' to take over an abandoned claim ('0':
-- fail closed), ' 1 - - <ilen> - 0\n' (begin_fast.lua), and for a resumable call its stored
-- request.
-- Returns the record itself when it is completed (begin_fast.lua)
--       | the fence alone for a first claim that is not resumable (begin_fast.lua)
--       | {1, fence, reclaimed 0/1, attempt, recovery point or nil, lease_until}
--       | {3, retry after ms} | {4} (key reused) | {5} (parked)
--       | {0, why the key is not an idem record}.
local ident, fp, request = ARGV[1], ARGV[2], ARGV[7]

-- What begin_fast.lua did not answer: a value of another type, a record to decide on, a
-- resumable call's first claim, or a malformed record.
if type(v) == 'table' then
  return {0, 'a value that is not a string (' .. tostring(v.err) .. ')'}
end

-- A claim: a new lease and retention, no response. It continues the record `rec` when the
-- previous attempt was this same request and did not finish: the recovery point, the stored
-- request and the note are kept and the attempt number grows; otherwise all start again. A
-- resumable call stores its request; the record is due to the completer when the lease ends.
local function claim(rec, fence, reclaimed, continues)
  local now = now_ms()
  local r = {
    state = 'i', fence = fence, lease_until = now + tonumber(ARGV[3]), attempt = 1,
    status = '-', error = '-', ident = ident, fp = fp, retain = ARGV[4],
    expires_at = now + tonumber(ARGV[4]), request = request,
  }
  if continues then
    r.attempt = tonumber(rec.attempt) + 1
    r.recovery = recovery_of(rec)
    r.request = request or request_of(rec)
    r.note = note_of(rec)
  end
  if r.request then
    r.resume_at = now
  end
  put(r, rec)
  return {1, fence, reclaimed, r.attempt, r.recovery or false, r.lease_until}
end

if not v then
  -- A resumable call's first claim (begin_fast.lua writes the others').
  return claim(nil, math.max(now_ms(), 1), 0, false)
end

local rec, why = parse(v, ident)
if not rec then
  return {0, why}
end

-- The rule of lifecycle::decide, row by row. A record whose retention ended is no longer here
-- (the key expired), which is the first claim. A completed record is answered as it is.
if rec.state == 'c' then
  return v
end
local same = fp_of(rec) == fp
if rec.state == 'p' then
  if same then
    return {5}
  end
  return {4}
end
if rec.state == 'r' then
  return claim(rec, rec.fence + 1, 0, same)
end
if not same then
  return {4}
end
local left = rec.lease_until - now_ms()
if left > 0 then
  return {3, left}
end
if ARGV[5] ~= '1' then
  return {3, tonumber(ARGV[3])}
end
return claim(rec, rec.fence + 1, 1, true)
