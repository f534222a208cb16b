-- lookup: the live record for (scope, key), for a client asking whether its request happened.
-- ARGV: scope, key.
-- Returns {1} none | {2, state, fence, fingerprint, lease ms left, status or nil, '0'/'1' or
-- nil, body or nil} | {0, why the key is not an idem record}.
local rec, why = load(ARGV[1], ARGV[2])
if rec == false then
  return {0, why}
end
if rec == nil or rec.state == 'released' then
  return {1}
end
if rec.state == 'in_progress' then
  return {2, rec.state, rec.fence, rec.fp, rec.lease_until - now_ms()}
end
local status = rec.status
if status == '-' then
  status = false
end
return {2, rec.state, rec.fence, rec.fp, 0, status, rec.error, rec.body}
