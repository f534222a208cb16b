-- complete: store the response and mark the record completed, if the fence still owns it.
-- ARGV: scope, key, fence, status ('' for none), '1' for a final error else '0', body.
-- Returns {1} done | {2} fence lost | {0, why the key is not an idem record}.
local now = now_ms()
local rec, why = load(ARGV[1], ARGV[2])
if rec == false then
  return {0, why}
end
if rec == nil or rec.fence_text ~= ARGV[3] or rec.state ~= 'in_progress'
  or rec.expires_at <= now then
  return {2}
end
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[1], 'recovery', 'status')
  redis.call('HSET', KEYS[1], 'state', 'completed', 'error', ARGV[5], 'body', ARGV[6])
else
  redis.call('HDEL', KEYS[1], 'recovery')
  redis.call('HSET', KEYS[1], 'state', 'completed', 'status', ARGV[4], 'error', ARGV[5],
    'body', ARGV[6])
end
return {1}
