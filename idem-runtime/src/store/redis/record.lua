-- The part every idem script shares: the server's clock, and the record under KEYS[1], read
-- and checked. Each script is this file followed by its own; every script touches KEYS[1] only.
--
-- A record is one hash:
--   v            format version: '1'
--   scope, key   the identity, compared with the caller's on every access
--   fp           the request's fingerprint, 32 bytes
--   state        'in_progress', 'completed' or 'released'
--   fence        decimal; the server's clock in ms at the first claim, + 1 on every take-over
--                or claim after a release
--   lease_until  ms since the epoch on the server's clock: when an in-progress claim is
--                presumed abandoned
--   expires_at   ms since the epoch on the server's clock: the end of retention; the key's
--                PEXPIREAT is the same instant
--   recovery     how far an attempt got (optional)
--   status       the stored response's transport status (optional)
--   error        '1' when the stored response is a final error, else '0' (completed records)
--   body         the stored response's bytes (completed records)

-- Now, in milliseconds, on the server's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An integer as Redis stores it: decimal digits, never an exponent.
local function int(n)
  return string.format('%d', n)
end

local FIELDS = {
  'v', 'scope', 'key', 'fp', 'state', 'fence', 'lease_until', 'expires_at',
  'recovery', 'status', 'error', 'body',
}

-- A fence or a time: decimal digits, at most 15 of them, so that Lua's doubles hold it exactly.
local function digits(s)
  return type(s) == 'string' and #s <= 15 and string.match(s, '^%d+$') ~= nil
end

-- The record under KEYS[1] for (scope, key): nil when there is none; false and the reason when
-- the key holds something that is not exactly an idem record of this identity.
local function load(scope, key)
  local r = redis.pcall('HMGET', KEYS[1], unpack(FIELDS))
  if r.err then
    return false, 'a value that is not a hash (' .. r.err .. ')'
  end
  if not r[1] then
    for i = 2, #FIELDS do
      if r[i] then
        return false, 'a hash without a format version'
      end
    end
    if redis.call('EXISTS', KEYS[1]) == 1 then
      return false, 'a hash without any idem field'
    end
    return nil
  end
  if r[1] ~= '1' then
    return false, 'a record of unknown format version ' .. r[1]
  end
  if r[2] ~= scope or r[3] ~= key then
    return false, 'the record of another scope and key'
  end
  local rec = {
    fp = r[4], state = r[5], fence_text = r[6], recovery = r[9], status = r[10], error = r[11],
    body = r[12],
  }
  if type(rec.fp) ~= 'string' or #rec.fp ~= 32 then
    return false, 'a record whose fingerprint is missing or not 32 bytes'
  end
  if rec.state ~= 'in_progress' and rec.state ~= 'completed' and rec.state ~= 'released' then
    return false, 'a record with an unknown state'
  end
  if not digits(r[6]) or not digits(r[7]) or not digits(r[8]) then
    return false, 'a record whose fence, lease or expiry is not a number'
  end
  rec.fence = tonumber(r[6])
  rec.lease_until = tonumber(r[7])
  rec.expires_at = tonumber(r[8])
  if rec.state == 'completed' then
    if not rec.body or (rec.error ~= '0' and rec.error ~= '1')
      or (rec.status and not digits(rec.status)) then
      return false, 'a completed record whose response is missing or malformed'
    end
  end
  return rec
end
