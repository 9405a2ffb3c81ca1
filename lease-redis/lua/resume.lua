-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset); KEYS[3]: failures hash; KEYS[4]:
-- ended runs (zset); KEYS[5]: suspended runs (zset); KEYS[6]: attempts hash; KEYS[7]: kinds
-- hash (id -> kind, for kinds other than the default); KEYS[8]: unique keys (hash: key -> the
-- run that took it last); KEYS[9]: each keyed run's key (hash); KEYS[10]: the wait hash;
-- KEYS[11]: the deadlines zset. KEYS[2] is the index of the kind ARGV[2].
-- ARGV[1]: encoded run id; ARGV[2]: the kind the client presumes ('' for the default)
-- Returns: {'none'}; {'refused', state, owner, expiry, fence, heartbeats, failure, attempts,
-- kind, times, now} when neither suspended nor failed; {'kind', actual} (nothing written: send again
-- with the index of the run's kind); or {'ok', state, owner, expiry, fence, heartbeats,
-- failure, attempts, kind, times, now}. A resumed run starts a fresh attempt budget, and takes
-- its unique key back unless another live run took it meanwhile: then it gives the key up. A
-- run waiting for a signal stops waiting, unanswered (its index entry, scored by the wait's
-- deadline, moves to now).
local r = read_run(KEYS[1], ARGV[1])
if not r then
  return { 'none' }
end
local now = now_micros()
if r.s ~= 'suspended' and r.s ~= 'failed' then
  return record_reply('refused', record(r, KEYS[3], KEYS[6], KEYS[7], KEYS[4]), now)
end
local kind = kind_of(KEYS[7], r.id, r.t)
if kind ~= ARGV[2] then
  return { 'kind', kind }
end
local key = redis.call('HGET', KEYS[9], r.id)
if key then
  local holder = unique_holder(KEYS[1], KEYS[8], key)
  if holder and holder ~= r.id then
    redis.call('HDEL', KEYS[9], r.id)
  else
    redis.call('HSET', KEYS[8], key, r.id)
  end
end
r.s = 'runnable'
r.e = num(now) -- claimable since now (common.lua's record format)
write_run(KEYS[1], r)
redis.call('HDEL', KEYS[3], r.id)
redis.call('ZREM', KEYS[4], r.id) -- a failed run resumed is no longer ended
redis.call('ZREM', KEYS[5], r.id)
redis.call('HDEL', KEYS[6], r.id) -- a fresh budget
redis.call('HDEL', KEYS[10], r.id)
redis.call('ZREM', KEYS[11], r.id)
index(KEYS[2], r, now)
wake(KEYS[2], now, now)
return record_reply('ok', record(r, KEYS[3], KEYS[6], KEYS[7], KEYS[4]), now)
