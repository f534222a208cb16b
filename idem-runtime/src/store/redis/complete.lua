-- complete: store the response and mark the record completed, if the fence still owns it. The
-- script is complete_fast.lua, then record.lua, then this file.
-- ARGV: identity, fence, status ('-' for none), '1' for a final error else '0', body, then the
-- parts complete_fast.lua puts together: 'idem2 i <fence> ', 'idem2 c <fence> ',
-- ' <status> <error> <ilen> - <blen>\n', and the identity's length in decimal.
-- Returns 1 done (complete_fast.lua) | {1} done | {2} fence lost
--       | {0, why the key is not an idem record}.
-- A key that exists is within its retention (or holds unfinished work): no clock is needed,
-- and the expiry is kept.
local rec, why = load()
if rec == false then
  return {0, why}
end
if rec == nil or rec.fence_text ~= ARGV[2] then
  return {2}
end
local body = ARGV[5]
if rec.state == 'c' then
  -- A retry of a completion whose reply was lost: done already, by this fence, with this answer.
  if rec.status == ARGV[3] and rec.error == ARGV[4] and body_of(rec) == body then
    return {1}
  end
  return {2}
end
if rec.state ~= 'i' then
  return {2}
end
if rec.version == 2 then
  redis.call('SET', KEYS[1],
    header('c', rec.fence_text, rec.lease_text, rec.attempt, ARGV[3], ARGV[4], #ARGV[1], '-',
      #body)
      .. ARGV[1] .. fp_of(rec) .. body,
    'KEEPTTL')
  return {1}
end
-- The work it held is finished: format 2 again, with what is left of its retention.
local r = parts(rec)
r.state, r.status, r.error, r.body = 'c', ARGV[3], ARGV[4], body
r.recovery, r.request, r.note, r.resume_at = nil, nil, nil, nil
put(r, rec)
return {1}
