-- lookup: the live record for (scope, key), for a client asking whether its request happened.
-- ARGV: scope, key.
-- Returns {1} none | {2, state, fence, fingerprint, lease ms left, status or nil, '0'/'1' or
-- nil, body or nil} | {0, why the key is not an idem record}.
local now = now_ms()
local rec, why = load(ARGV[1], ARGV[2])
if rec == false then
  return {0, why}
end
if rec == nil or rec.state == 'released' or rec.expires_at <= now then
  return {1}
end
return {2, rec.state, rec.fence, rec.fp, rec.lease_until - now, rec.status or false,
  rec.error or false, rec.body or false}
