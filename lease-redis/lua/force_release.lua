-- KEYS[1]: run hash; KEYS[2]: claimable index (zset)
-- ARGV[1]: none
-- Returns: {'none'}; {'refused', state, ...} when suspended or completed; or
-- {'ok', state, owner, expiry, fence, heartbeats, now}
local r = read_run(KEYS[1])
if not r then
  return { 'none' }
end
local now = now_micros()
if r.s ~= 'runnable' then
  return { 'refused', r.s }
end
redis.call('HDEL', KEYS[1], 'o', 'e')
r.o = ''
r.e = ''
index(KEYS[2], r, r.f, now)
local rec = record(r)
return { 'ok', rec[1], rec[2], rec[3], rec[4], rec[5], num(now) }
