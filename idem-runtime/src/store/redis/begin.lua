-- begin: claim, replay, in progress, key reused, or take over; one atomic step.
-- ARGV: scope, key, fingerprint, lease ms, retain ms, '1' to take over an abandoned claim
-- ('0': fail closed).
-- Returns {1, fence, reclaimed 0/1, recovery point or nil} | {2, status or nil, '0'/'1', body}
--       | {3, retry after ms} | {4} (key reused) | {0, why the key is not an idem record}.
local scope, key, fp = ARGV[1], ARGV[2], ARGV[3]
local lease, retain = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
local rec, why = load(scope, key)
if rec == false then
  return {0, why}
end

if rec == nil then
  -- The first claim: the fence starts at the server's clock, so a record that expired and is
  -- created again starts above every fence its previous life handed out.
  local fence = math.max(now, 1)
  redis.call('HSET', KEYS[1], 'v', '1', 'scope', scope, 'key', key, 'fp', fp,
    'state', 'in_progress', 'fence', int(fence), 'lease_until', int(now + lease),
    'expires_at', int(now + retain))
  redis.call('PEXPIREAT', KEYS[1], int(now + retain))
  return {1, fence, 0}
end

-- Takes the record over: fence + 1, a new lease and retention, no response; the recovery point
-- is kept only when the previous attempt was this same request and did not finish.
local function take(reclaimed, keep_recovery_point)
  local fence = rec.fence + 1
  redis.call('HSET', KEYS[1], 'fp', fp, 'state', 'in_progress', 'fence', int(fence),
    'lease_until', int(now + lease), 'expires_at', int(now + retain))
  if keep_recovery_point then
    redis.call('HDEL', KEYS[1], 'status', 'error', 'body')
  else
    redis.call('HDEL', KEYS[1], 'status', 'error', 'body', 'recovery')
  end
  redis.call('PEXPIREAT', KEYS[1], int(now + retain))
  if keep_recovery_point and rec.recovery then
    return {1, fence, reclaimed, rec.recovery}
  end
  return {1, fence, reclaimed}
end

-- The rule of lifecycle::decide, row by row.
local same = rec.fp == fp
local expired = rec.expires_at <= now
if expired or rec.state == 'released' then
  return take(0, (not expired) and same)
end
if not same then
  return {4}
end
if rec.state == 'completed' then
  return {2, rec.status or false, rec.error, rec.body}
end
local left = rec.lease_until - now
if left > 0 then
  return {3, left}
end
if ARGV[6] ~= '1' then
  return {3, lease}
end
return take(1, true)
