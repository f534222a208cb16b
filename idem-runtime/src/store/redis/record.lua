-- The part every idem script shares: the server's clock, and the record under KEYS[1], read
-- and checked. Each script is this file followed by its own; every script touches KEYS[1] only.
--
-- A record is one hash:
--   meta      '<version> <state> <fence> <lease_until> <status> <error>', one field so that
--             reading and writing the hot part of a record is one value:
--               version      1
--               state        in_progress, completed or released
--               fence        decimal; the server's clock in ms at the first claim, + 1 on every
--                            take-over or claim after a release
--               lease_until  ms since the epoch on the server's clock: when an in-progress claim
--                            is presumed abandoned
--               status       the stored response's transport status, or '-'
--               error        '1' when the stored response is a final error, '0' when it is not,
--                            '-' before completion
--   scope, key  the identity, compared with the caller's on every access
--   fp          the request's fingerprint, 32 bytes
--   recovery    how far an attempt got (optional)
--   attempt     which attempt of the request holds the record, when above 1 (optional: absent
--               means 1)
--   body        the stored response's bytes (completed records)
--
-- Retention is the key's own expiry (PEXPIRE, on the server's clock): a key that exists has not
-- expired, and Redis removes it when it has.

-- Now, in milliseconds, on the server's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The meta field of a record. Numbers are concatenated as Lua prints them, "%.14g": exact
-- digits without an exponent below 10^14 ms (year 5138), which every fence and time stays under
-- (leases and retention are capped at 2^45 ms).
local function meta(state, fence, lease_until, status, error)
  return '1 ' .. state .. ' ' .. fence .. ' ' .. lease_until .. ' ' .. status .. ' ' .. error
end

-- The record under KEYS[1] for (scope, key): nil when there is none; false and the reason when
-- the key holds something that is not exactly an idem record of this identity.
local function load(scope, key)
  local r = redis.pcall('HMGET', KEYS[1], 'meta', 'scope', 'key', 'fp', 'recovery', 'body',
    'attempt')
  if r.err then
    return false, 'a value that is not a hash (' .. r.err .. ')'
  end
  if not r[1] then
    if r[2] or r[3] or r[4] or r[5] or r[6] or r[7] or redis.call('EXISTS', KEYS[1]) == 1 then
      return false, 'a hash without the meta field of an idem record'
    end
    return nil
  end
  local version, state, fence, lease_until, status, error =
    string.match(r[1], '^(%d+) (%l[%l_]*) (%d+) (%d+) ([%d-]+) ([01-])$')
  if version ~= '1' then
    if version then
      return false, 'a record of unknown format version ' .. version
    end
    return false, 'a record whose meta field is malformed'
  end
  if r[2] ~= scope or r[3] ~= key then
    return false, 'the record of another scope and key'
  end
  -- At most 15 digits: Lua's numbers hold them exactly.
  if #fence > 15 or #lease_until > 15 then
    return false, 'a record whose fence or lease is out of range'
  end
  if state ~= 'in_progress' and state ~= 'completed' and state ~= 'released' then
    return false, 'a record with an unknown state'
  end
  if type(r[4]) ~= 'string' or #r[4] ~= 32 then
    return false, 'a record whose fingerprint is missing or not 32 bytes'
  end
  if r[7] and (#r[7] > 9 or not string.match(r[7], '^%d+$')) then
    return false, 'a record whose attempt number is malformed'
  end
  if state == 'completed' and (not r[6] or error == '-'
      or (status ~= '-' and (#status > 5 or not string.match(status, '^%d+$')))) then
    return false, 'a completed record whose response is missing or malformed'
  end
  return {
    state = state, fence = tonumber(fence), fence_text = fence, lease_until = tonumber(lease_until),
    lease_text = lease_until, status = status, error = error, fp = r[4], recovery = r[5],
    body = r[6], attempt = tonumber(r[7] or '1'),
  }
end
