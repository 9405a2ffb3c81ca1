-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset); KEYS[3]: failures hash; KEYS[4]:
-- ended runs (zset); KEYS[5]: suspended runs (zset); KEYS[6]: attempts hash
-- ARGV[1]: encoded run id
-- Returns: {'none'}; {'refused', state, owner, expiry, fence, heartbeats, failure, attempts,
-- now} when neither suspended nor failed; or {'ok', state, owner, expiry, fence, heartbeats,
-- failure, attempts, now}. A resumed run starts a fresh attempt budget.
local r = read_run(KEYS[1], ARGV[1])
if not r then
  return { 'none' }
end
local now = now_micros()
if r.s ~= 'suspended' and r.s ~= 'failed' then
  local rec = record(r, KEYS[3], KEYS[6])
  return { 'refused', rec[1], rec[2], rec[3], rec[4], rec[5], rec[6], rec[7], num(now) }
end
r.s = 'runnable'
r.e = ''
write_run(KEYS[1], r)
redis.call('HDEL', KEYS[3], r.id)
redis.call('ZREM', KEYS[4], r.id) -- a failed run resumed is no longer ended
redis.call('ZREM', KEYS[5], r.id)
redis.call('HDEL', KEYS[6], r.id) -- a fresh budget
index(KEYS[2], r, now)
local rec = record(r, KEYS[3], KEYS[6])
return { 'ok', rec[1], rec[2], rec[3], rec[4], rec[5], rec[6], rec[7], num(now) }
