-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset)
-- ARGV[1]: encoded run id
-- Returns: {'none'}; {'refused', state} when suspended or completed; or
-- {'ok', state, owner, expiry, fence, heartbeats, now}
local r = read_run(KEYS[1], ARGV[1])
if not r then
  return { 'none' }
end
local now = now_micros()
if r.s ~= 'runnable' then
  return { 'refused', r.s }
end
r.o = ''
r.e = ''
write_run(KEYS[1], r)
index(KEYS[2], r, now)
local rec = record(r)
return { 'ok', rec[1], rec[2], rec[3], rec[4], rec[5], num(now) }
