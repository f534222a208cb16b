-- complete, first part: the usual case, checked and written before anything else is set up.
-- The record is in progress under this fence and identity, with no recovery point: its value
-- is `'idem2 i <fence> ' <lease_until> ' ' <attempt> ' - - ' <ilen> ' - 0\n' <identity> <fp>`,
-- and the completed one keeps its lease, attempt and fingerprint around the caller's parts
-- (ARGV[6..8], so that no number is converted here). Anything else goes on to the checks of
-- complete.lua.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' and string.sub(v, 1, #ARGV[6]) == ARGV[6] then
  local lease_until, attempt, ilen, at =
    string.match(v, '^(%d+) (%d+) %- %- (%d+) %- 0\n()', #ARGV[6] + 1)
  local ident = ARGV[1]
  local fp_at = at and at + #ident
  if fp_at and #v == fp_at + 31 and ilen == ARGV[9] and #lease_until <= 15 and #attempt <= 9
      and string.sub(v, at, fp_at - 1) == ident then
    redis.call('SET', KEYS[1],
      ARGV[7] .. lease_until .. ' ' .. attempt .. ARGV[8] .. ident .. string.sub(v, fp_at)
        .. ARGV[5],
      'KEEPTTL')
    -- Written: the integer alone, which the client reads without an array.
    return 1
  end
end
