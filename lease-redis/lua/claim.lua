-- KEYS[1]: run hash; KEYS[2]: claimable index (zset)
-- ARGV[1]: worker id; ARGV[2]: TTL in milliseconds
-- Returns: {'none'}; {'refused', state, owner, expiry, fence, now}; or {'ok', fence, expiry}
local r = read_run(KEYS[1])
if not r then
  return { 'none' }
end
local now = now_micros()
if not claimable(r, now) then
  return { 'refused', r.s, r.o, r.e, r.f, num(now) }
end
local expires = now + tonumber(ARGV[2]) * 1000
local fence = take(KEYS[1], KEYS[2], r, ARGV[1], expires)
return { 'ok', fence, num(expires) }
