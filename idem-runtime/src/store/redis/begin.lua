-- begin: claim, replay, in progress, key reused, or take over; one atomic step. The script is
-- begin_fast.lua, then record.lua, then this file.
-- ARGV: identity, fingerprint, lease ms, retain ms, '1' to take over an abandoned claim ('0':
-- fail closed), ' 1 - - <ilen> - 0\n' (begin_fast.lua).
-- Returns the record itself when it is completed (begin_fast.lua)
--       | {1, fence, reclaimed 0/1, attempt, recovery point or nil}
--       | {3, retry after ms} | {4} (key reused) | {0, why the key is not an idem record}.
local ident, fp = ARGV[1], ARGV[2]

-- What begin_fast.lua did not answer: a value of another type, a record to decide on, or a
-- malformed one.
if type(v) == 'table' then
  return {0, 'a value that is not a string (' .. tostring(v.err) .. ')'}
end

local rec, why = parse(v, ident)
if not rec then
  return {0, why}
end

-- Takes the record over: fence + 1, a new lease and retention, no response. When the previous
-- attempt was this same request and did not finish (continues), the recovery point is kept and
-- the attempt number grows; otherwise both start again.
local function take(reclaimed, continues)
  local now = now_ms()
  local fence = rec.fence + 1
  local attempt, recovery = 1, nil
  if continues then
    attempt = tonumber(rec.attempt) + 1
    recovery = recovery_of(rec)
  end
  if recovery then
    redis.call('SET', KEYS[1],
      header('i', fence, now + tonumber(ARGV[3]), attempt, '-', '-', #ident, #recovery, 0)
        .. ident .. fp .. recovery,
      'PX', ARGV[4])
    return {1, fence, reclaimed, attempt, recovery}
  end
  redis.call('SET', KEYS[1],
    header('i', fence, now + tonumber(ARGV[3]), attempt, '-', '-', #ident, '-', 0)
      .. ident .. fp,
    'PX', ARGV[4])
  return {1, fence, reclaimed, attempt}
end

-- The rule of lifecycle::decide, row by row. A record whose retention ended is no longer here
-- (the key expired), which is the first claim in begin_fast.lua. A completed record was
-- answered there too; one that reaches this point is malformed, and parse said so.
local same = fp_of(rec) == fp
if rec.state == 'r' then
  return take(0, same)
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
return take(1, true)
