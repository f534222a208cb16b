-- begin, first part: the two usual cases, answered before anything else is set up.
-- ARGV as begin.lua's. A resumable claim (ARGV[7], its request) is never a usual case: it goes
-- on to begin.lua.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' then
  -- A completed record is answered as it is: the caller checks it whole, then replays it or
  -- answers key reused (no clock and no write is needed).
  if string.sub(v, 1, 8) == 'idem2 c ' then
    return v
  end
elseif not v and not ARGV[7] then
  -- The first claim (or the first since the record expired): the fence starts at the server's
  -- clock, above every fence an expired life of the record handed out. ARGV[6] is the rest of
  -- the first line, ' 1 - - <ilen> - 0\n', so that only the two times are converted here, by
  -- one `%d` format (cheaper than Lua's own number-to-text). The answer is the fence alone: a
  -- first claim, not reclaimed, attempt 1, no recovery point (the array of begin.lua's claim
  -- costs the server and the client more).
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local fence = math.max(now, 1)
  redis.call('SET', KEYS[1],
    string.format('idem2 i %d %d', fence, now + tonumber(ARGV[3])) .. ARGV[6] .. ARGV[1]
      .. ARGV[2],
    'PX', ARGV[4])
  return fence
end
