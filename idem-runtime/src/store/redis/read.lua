-- read: the value under KEYS[1] as it is, with the server's clock and the key's remaining
-- retention, for the caller to check and decode (lookup, and the operator's inspect and list).
-- Returns {1, value or nil, now ms, retention ms left} | {0, why the key is not an idem record}.
local v, why = get()
if v == false then
  return {0, why}
end
return {1, v or false, now_ms(), redis.call('PTTL', KEYS[1])}
