-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset)
-- ARGV[1]: encoded run id; ARGV[2]: worker id; ARGV[3]: TTL in milliseconds
-- Returns: {'none'}; {'refused', state, owner, expiry, fence, now}; or {'ok', fence, expiry}
local r = read_run(KEYS[1], ARGV[1])
if not r then
  return { 'none' }
end
local now = now_micros()
if not claimable(r, now) then
  return { 'refused', r.s, r.o, r.e, r.f, num(now) }
end
local expires = now + tonumber(ARGV[3]) * 1000
local fence = take(KEYS[1], KEYS[2], r, ARGV[2], expires)
return { 'ok', fence, num(expires) }
