-- The part every record script shares: the server's clock, and the record under KEYS[1], read,
-- checked and written. Each script is this file followed by its own; every record script
-- touches KEYS[1] only.
--
-- A record is one string, so that reading it is one GET and writing it one SET. It has two
-- forms. A record that holds no unfinished work (format 2, what most records are) is
--
--   idem2 <state> <fence> <lease_until> <attempt> <status> <error> <ilen> <rlen> <blen>\n
--   <identity><fingerprint><recovery><body>
--
-- and its retention is the key's own expiry (SET … PX, on the server's clock): a key that
-- exists has not expired, and Redis removes it when it has. A record that holds unfinished work
-- (lifecycle::unfinished: parked, or in progress with a stored request or a note) is
--
--   idem3 <state> <fence> <lease_until> <attempt> <status> <error> <ilen> <rlen> <blen>
--         <qlen> <nlen> <resume_at> <expires_at>\n
--   <identity><fingerprint><recovery><body><request><note>
--
-- (one line), written without an expiry: such a record is never lost to its retention. When
-- its work ends (completed, released), it is written in format 2 again, with what is left of
-- its retention (`expires_at`) as the key's expiry; if nothing is left, it goes at once.
--
--   idem2, idem3 the format
--   state        i (in progress), c (completed), r (released) or, in format 3, p (parked)
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
--   qlen, nlen   the lengths of the stored request of a resumable call and of the note (why
--                the last attempt did not finish, or why the work was parked); '-' for none
--   resume_at    ms on the server's clock: when the completer may resume the claim (with the
--                lease run out too); '-' when it may not
--   expires_at   ms on the server's clock: when the record's retention ends (its claim's time
--                plus the retention); '-' for never
--   identity     the scope's length in decimal, a space, the scope, the key: compared with the
--                caller's (ARGV[1], built the same way) on every access
--   fingerprint  the request's, 32 bytes
--
-- Numbers have at most 15 digits. The completer's index, a sorted set beside the records, is
-- described in index.lua.

-- Now, in milliseconds, on the server's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A format 2 record's first line. Numbers are concatenated as Lua prints them, "%.14g": exact
-- digits without an exponent below 10^14 ms (year 5138), which every fence and time stays
-- under (leases and retention are capped at 2^45 ms).
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

local function length_or_none(text)
  return text == '-' or (#text <= 9 and string.find(text, '^%d+$') ~= nil)
end

local function time_or_none(text)
  return text == '-' or (#text <= 15 and string.find(text, '^%d+$') ~= nil)
end

-- The record `v` for the identity `ident`, its parts; false and the reason when `v` is not
-- exactly an idem record of this identity.
local function parse(v, ident)
  local version = 2
  local state, fence, lease_until, attempt, status, error, ilen, rlen, blen, at =
    string.match(v,
      '^idem2 ([icr]) (%d+) (%d+) (%d+) ([%d-]+) ([01-]) (%d+) ([%d-]+) (%d+)\n()')
  local qlen, nlen, resume_at, expires_at = '-', '-', '-', '-'
  if not state then
    version = 3
    state, fence, lease_until, attempt, status, error, ilen, rlen, blen, qlen, nlen, resume_at,
      expires_at, at = string.match(v,
        '^idem3 ([icrp]) (%d+) (%d+) (%d+) ([%d-]+) ([01-]) (%d+) ([%d-]+) (%d+) ([%d-]+) '
          .. '([%d-]+) ([%d-]+) ([%d-]+)\n()')
  end
  if not state then
    local other = string.match(v, '^idem(%d+) ')
    if other and other ~= '2' and other ~= '3' then
      return false, 'a record of unknown format version ' .. other
    end
    return false, 'a value whose first line is not that of an idem record'
  end
  -- At most 15 digits: Lua's numbers hold them exactly.
  if #fence > 15 or #lease_until > 15 or #attempt > 9 or #ilen > 9 or #rlen > 9
      or #blen > 9 or not (length_or_none(qlen) and length_or_none(nlen)
        and time_or_none(resume_at) and time_or_none(expires_at)) then
    return false, 'a record whose numbers are out of range'
  end
  local recovery = rlen ~= '-'
  if recovery and not string.find(rlen, '^%d+$') then
    return false, 'a record whose recovery point is malformed'
  end
  local fp_at = at + tonumber(ilen)
  local rec_at = fp_at + 32
  local body_at = rec_at + (tonumber(rlen) or 0)
  local req_at = body_at + tonumber(blen)
  local note_at = req_at + (tonumber(qlen) or 0)
  if #v ~= note_at + (tonumber(nlen) or 0) - 1 then
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
    version = version, state = state, fence = tonumber(fence), fence_text = fence,
    lease_until = tonumber(lease_until), lease_text = lease_until, attempt = attempt,
    status = status, error = error, rlen = rlen, recovery = recovery, fp_at = fp_at,
    rec_at = rec_at, body_at = body_at, req_at = req_at, note_at = note_at, qlen = qlen,
    nlen = nlen, resume_at = tonumber(resume_at), expires_at = tonumber(expires_at), v = v,
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
  return string.sub(rec.v, rec.body_at, rec.req_at - 1)
end

local function request_of(rec)
  if rec.qlen ~= '-' then
    return string.sub(rec.v, rec.req_at, rec.note_at - 1)
  end
end

local function note_of(rec)
  if rec.nlen ~= '-' then
    return string.sub(rec.v, rec.note_at)
  end
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

-- A parsed record as a table to change and `put`: every part, the identity ARGV[1].
local function parts(rec)
  return {
    state = rec.state, fence = rec.fence_text, lease_until = rec.lease_text,
    attempt = rec.attempt, status = rec.status, error = rec.error, ident = ARGV[1],
    fp = fp_of(rec), recovery = recovery_of(rec), body = body_of(rec),
    request = request_of(rec), note = note_of(rec), resume_at = rec.resume_at,
    expires_at = rec.expires_at,
  }
end

-- Whether the record `r` holds unfinished work (lifecycle::unfinished): parked, or in progress
-- with a stored request or a note.
local function holds_work(r)
  return r.state == 'p' or (r.state == 'i' and (r.request ~= nil or r.note ~= nil))
end

-- Writes `r` under KEYS[1], replacing `from` (the parsed record it was made from; nil for a
-- new one). A record that holds unfinished work is written in format 3 without an expiry (its
-- `expires_at` is kept, or taken from the key's time to live); any other in format 2: with
-- the expiry `r.retain` ms from now for a new claim, else what is left of the retention of a
-- format 3 record it replaces (gone at once when nothing is), else the key's own.
local function put(r, from)
  local recovery, body = r.recovery or '', r.body or ''
  local rlen = r.recovery and #r.recovery or '-'
  if holds_work(r) then
    local expires_at = r.expires_at
    if expires_at == nil and from ~= nil and from.version == 2 then
      local ttl = redis.call('PTTL', KEYS[1])
      if ttl >= 0 then
        expires_at = now_ms() + ttl
      end
    end
    redis.call('SET', KEYS[1],
      'idem3 ' .. r.state .. ' ' .. r.fence .. ' ' .. r.lease_until .. ' ' .. r.attempt .. ' '
        .. r.status .. ' ' .. r.error .. ' ' .. #r.ident .. ' ' .. rlen .. ' ' .. #body .. ' '
        .. (r.request and #r.request or '-') .. ' ' .. (r.note and #r.note or '-') .. ' '
        .. (r.resume_at or '-') .. ' ' .. (expires_at or '-') .. '\n'
        .. r.ident .. r.fp .. recovery .. body .. (r.request or '') .. (r.note or ''))
    return
  end
  local v = header(r.state, r.fence, r.lease_until, r.attempt, r.status, r.error, #r.ident,
    rlen, #body) .. r.ident .. r.fp .. recovery .. body
  if r.retain then
    redis.call('SET', KEYS[1], v, 'PX', r.retain)
  elseif from ~= nil and from.version == 3 then
    if from.expires_at == nil then
      redis.call('SET', KEYS[1], v)
    else
      local left = from.expires_at - now_ms()
      if left > 0 then
        redis.call('SET', KEYS[1], v, 'PX', left)
      else
        redis.call('DEL', KEYS[1])
      end
    end
  else
    redis.call('SET', KEYS[1], v, 'KEEPTTL')
  end
end
