-- The part every idem script shares: the server's clock, and the record under KEYS[1], read
-- and checked. Each script is this file followed by its own; every script touches KEYS[1] only.
--
-- A record is one string, so that reading it is one GET and writing it one SET:
--
--   idem2 <state> <fence> <lease_until> <attempt> <status> <error> <ilen> <rlen> <blen>\n
--   <identity><fingerprint><recovery><body>
--
--   idem2        the format, version 2
--   state        i (in progress), c (completed) or r (released)
--   fence        decimal; the server's clock in ms at the first claim, + 1 on every take-over
--                or claim after a release
--   lease_until  ms since the epoch on the server's clock: when an in-progress claim is
--                presumed abandoned
--   attempt      which attempt of the request holds the record, from 1
--   status       the stored response's transport status, or '-'
--   error        '1' when the stored response is a final error, '0' when it is not, '-'
--                before completion
--   ilen, rlen, blen  the lengths of the identity, the recovery point ('-' when there is none)
--                and the body
--   identity     the scope's length in decimal, a space, the scope, the key: compared with the
--                caller's (ARGV[1], built the same way) on every access
--   fingerprint  the request's, 32 bytes
--
-- Retention is the key's own expiry (SET … PX, on the server's clock): a key that exists has
-- not expired, and Redis removes it when it has.

-- Now, in milliseconds, on the server's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A record's first line. Numbers are concatenated as Lua prints them, "%.14g": exact digits
-- without an exponent below 10^14 ms (year 5138), which every fence and time stays under
-- (leases and retention are capped at 2^45 ms).
local function header(state, fence, lease_until, attempt, status, error, ilen, rlen, blen)
  return 'idem2 ' .. state .. ' ' .. fence .. ' ' .. lease_until .. ' ' .. attempt .. ' '
    .. status .. ' ' .. error .. ' ' .. ilen .. ' ' .. rlen .. ' ' .. blen .. '\n'
end

-- The value under KEYS[1]: nil when there is none, false and the reason when it is not a
-- string.
local function get()
  local v = redis.pcall('GET', KEYS[1])
  if type(v) == 'table' then
    return false, 'a value that is not a string (' .. tostring(v.err) .. ')'
  end
  -- A missing key reads as false.
  return v or nil
end

-- The record `v` for the identity `ident`, its parts; false and the reason when `v` is not
-- exactly an idem record of this identity.
local function parse(v, ident)
  local state, fence, lease_until, attempt, status, error, ilen, rlen, blen, at =
    string.match(v,
      '^idem2 ([icr]) (%d+) (%d+) (%d+) ([%d-]+) ([01-]) (%d+) ([%d-]+) (%d+)\n()')
  if not state then
    local version = string.match(v, '^idem(%d+) ')
    if version and version ~= '2' then
      return false, 'a record of unknown format version ' .. version
    end
    return false, 'a value whose first line is not that of an idem record'
  end
  -- At most 15 digits: Lua's numbers hold them exactly.
  if #fence > 15 or #lease_until > 15 or #attempt > 9 or #ilen > 9 or #rlen > 9
      or #blen > 9 then
    return false, 'a record whose numbers are out of range'
  end
  local recovery = rlen ~= '-'
  if recovery and not string.find(rlen, '^%d+$') then
    return false, 'a record whose recovery point is malformed'
  end
  local fp_at = at + tonumber(ilen)
  local rec_at = fp_at + 32
  local body_at = rec_at + (tonumber(rlen) or 0)
  if #v ~= body_at + tonumber(blen) - 1 then
    return false, 'a record whose length is not what its first line says'
  end
  if string.sub(v, at, fp_at - 1) ~= ident then
    return false, 'the record of another scope and key'
  end
  if state == 'c' then
    if error == '-' or (status ~= '-' and (#status > 5 or not string.find(status, '^%d+$'))) then
      return false, 'a completed record whose response is malformed'
    end
  elseif status ~= '-' or error ~= '-' or blen ~= '0' then
    return false, 'a record in progress or released with a response'
  end
  return {
    state = state, fence = tonumber(fence), fence_text = fence,
    lease_until = tonumber(lease_until), lease_text = lease_until, attempt = attempt,
    status = status, error = error, rlen = rlen, recovery = recovery, fp_at = fp_at,
    rec_at = rec_at, body_at = body_at, v = v,
  }
end

-- The parts of a parsed record that are bytes, cut out only where a script needs them.
local function fp_of(rec)
  return string.sub(rec.v, rec.fp_at, rec.rec_at - 1)
end

local function recovery_of(rec)
  if rec.recovery then
    return string.sub(rec.v, rec.rec_at, rec.body_at - 1)
  end
end

local function body_of(rec)
  return string.sub(rec.v, rec.body_at)
end

-- The record under KEYS[1] for ARGV[1]: nil when there is none; false and the reason when the
-- key holds something that is not exactly an idem record of this identity.
local function load()
  local v, why = get()
  if not v then
    return v, why
  end
  return parse(v, ARGV[1])
end
