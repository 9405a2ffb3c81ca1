-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset); KEYS[3]: failures hash; KEYS[4]:
-- delayed runs (zset); KEYS[5]: attempts hash
-- ARGV[1]: encoded run id
-- Returns: {'none'}; {'refused', state} when suspended, completed or failed; or
-- {'ok', state, owner, expiry, fence, heartbeats, failure, attempts, now}. The holder's
-- attempt stays counted (an operator takes the run from a holder that hung or vanished). A retry delay ends: the run
-- is claimable at once.
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
redis.call('ZREM', KEYS[4], r.id) -- a delay ends
index(KEYS[2], r, now)
local rec = record(r, KEYS[3], KEYS[5])
return { 'ok', rec[1], rec[2], rec[3], rec[4], rec[5], rec[6], rec[7], num(now) }
