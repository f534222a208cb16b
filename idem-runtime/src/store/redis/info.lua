-- info: the record under KEYS[1] as an operator sees it, whatever its state.
-- ARGV: scope, key (both '' for whatever identity the record holds: a key found by a scan),
-- '1' to include its recovery point and answer.
-- Returns {1} none
--       | {2, scope, key, state, fence, attempt, fingerprint, lease ms left, retention ms left,
--          now ms, recovery point or nil, status or nil, '0'/'1'/'-', body or nil}
--       | {0, why the key is not an idem record}.
local scope, key = ARGV[1], ARGV[2]
if scope == '' and key == '' then
  local id = redis.call('HMGET', KEYS[1], 'scope', 'key')
  if not id[1] or not id[2] then
    if redis.call('EXISTS', KEYS[1]) == 0 then
      return {1}
    end
    return {0, 'a value without the identity of an idem record'}
  end
  scope, key = id[1], id[2]
end
local rec, why = load(scope, key)
if rec == false then
  return {0, why}
end
if rec == nil then
  return {1}
end
local now = now_ms()
local full = ARGV[3] == '1'
local status = rec.status
if status == '-' then
  status = false
end
return {2, scope, key, rec.state, rec.fence, rec.attempt, rec.fp, rec.lease_until - now,
  redis.call('PTTL', KEYS[1]), now, full and rec.recovery or false, full and status or false,
  rec.error, full and rec.body or false}
