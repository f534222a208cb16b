-- begin: claim, replay, in progress, key reused, or take over; one atomic step.
-- ARGV: scope, key, fingerprint, lease ms, retain ms, '1' to take over an abandoned claim
-- ('0': fail closed).
-- Returns {1, fence, reclaimed 0/1, attempt, recovery point or nil}
--       | {2, status or nil, '0'/'1', body}
--       | {3, retry after ms} | {4} (key reused) | {0, why the key is not an idem record}.
local scope, key, fp = ARGV[1], ARGV[2], ARGV[3]

if redis.call('EXISTS', KEYS[1]) == 0 then
  -- The first claim (or the first since the record expired): the fence starts at the server's
  -- clock, above every fence an expired life of the record handed out.
  local now = now_ms()
  local fence = math.max(now, 1)
  redis.call('HSET', KEYS[1], 'meta',
    meta('in_progress', fence, now + tonumber(ARGV[4]), '-', '-'),
    'scope', scope, 'key', key, 'fp', fp)
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {1, fence, 0, 1}
end

local rec, why = load(scope, key)
if not rec then
  return {0, why}
end

-- Takes the record over: fence + 1, a new lease and retention, no response. When the previous
-- attempt was this same request and did not finish (continues), the recovery point is kept and
-- the attempt number grows; otherwise both start again.
local function take(reclaimed, continues)
  local now = now_ms()
  local fence = rec.fence + 1
  local attempt = 1
  if continues then
    attempt = rec.attempt + 1
  end
  redis.call('HSET', KEYS[1], 'meta',
    meta('in_progress', fence, now + tonumber(ARGV[4]), '-', '-'), 'fp', fp,
    'attempt', attempt)
  if rec.body then
    redis.call('HDEL', KEYS[1], 'body')
  end
  if rec.recovery and not continues then
    redis.call('HDEL', KEYS[1], 'recovery')
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  if continues and rec.recovery then
    return {1, fence, reclaimed, attempt, rec.recovery}
  end
  return {1, fence, reclaimed, attempt}
end

-- The rule of lifecycle::decide, row by row. A record whose retention ended is no longer here
-- (the key expired), which is the first claim above.
local same = rec.fp == fp
if rec.state == 'released' then
  return take(0, same)
end
if not same then
  return {4}
end
if rec.state == 'completed' then
  if rec.status == '-' then
    return {2, false, rec.error, rec.body}
  end
  return {2, rec.status, rec.error, rec.body}
end
local left = rec.lease_until - now_ms()
if left > 0 then
  return {3, left}
end
if ARGV[6] ~= '1' then
  return {3, tonumber(ARGV[4])}
end
return take(1, true)
