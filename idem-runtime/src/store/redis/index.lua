-- The completer's index: a sorted set, KEYS[1] = `<prefix>{due}`, of the Redis keys of records
-- that hold (or held) unfinished work, each scored with when it becomes due, in ms on the
-- server's clock; work the completer cannot take (parked, or suspended without a stored
-- request) is scored at the end of time, where only operators read it. It is a hint: in a
-- cluster a script touches one slot, so the index cannot be written in the same step as a
-- record, and the record is always the truth. `due` reads the entries whose time came, then each
-- record, lists the records that are due, moves the others' entries to when they will be (the
-- end of time for work it cannot take), and removes those of records that hold no work any more
-- (finished, released, gone); an operator's listing reads every entry, and removes those too.
--
-- No entry may go missing while its record holds resumable work. A resumable claim and an
-- operator's retry write their entry before the record (so that a crash between the two leaves
-- an entry too many, never one too few), and again after it; a suspension writes it after the
-- record. A score's fraction is a version: every write changes it, and `due` changes or removes
-- an entry only if its score is still the one it read alongside the record. An entry rewritten
-- since (because its record was claimed again) is left alone.
--
-- ARGV[1] says what to do:
--   'set', member, when (ms; '' for this server's clock now plus ARGV[4] ms), ARGV[4]
--       writes the entry. Returns 1.
--   'page', offset, count
--       the entries due by this server's clock, oldest first: {member, score, member, …}.
--   'all', offset, count
--       every entry, by score: {member, score, member, …}.
--   'fix', then triples member, score as read, new time in ms or '-' to remove
--       applies each only where the score is still the one read. Returns how many applied.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Scores are `ms + version / 128`: exact in a double for every time below 2^46 ms.
local function write(member, at, current)
  local version = 0
  if current then
    local n = tonumber(current)
    version = (math.floor((n - math.floor(n)) * 128 + 0.5) + 1) % 128
  end
  redis.call('ZADD', KEYS[1], math.floor(at) + version / 128, member)
end

local op = ARGV[1]
if op == 'set' then
  local at = tonumber(ARGV[3]) or (now_ms() + tonumber(ARGV[4]))
  write(ARGV[2], at, redis.call('ZSCORE', KEYS[1], ARGV[2]))
  return 1
elseif op == 'page' then
  return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now_ms() + 1), 'WITHSCORES',
    'LIMIT', ARGV[2], ARGV[3])
elseif op == 'all' then
  return redis.call('ZRANGE', KEYS[1], ARGV[2], tonumber(ARGV[2]) + tonumber(ARGV[3]) - 1,
    'WITHSCORES')
elseif op == 'fix' then
  local applied = 0
  for i = 2, #ARGV - 2, 3 do
    local current = redis.call('ZSCORE', KEYS[1], ARGV[i])
    if current and tonumber(current) == tonumber(ARGV[i + 1]) then
      if ARGV[i + 2] == '-' then
        redis.call('ZREM', KEYS[1], ARGV[i])
      else
        write(ARGV[i], tonumber(ARGV[i + 2]), current)
      end
      applied = applied + 1
    end
  end
  return applied
end
return redis.error_reply('unknown index operation')
