-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset); KEYS[3]: failures hash (the reason of
-- a failed or cancelled run); KEYS[4]: delayed runs (zset); KEYS[5]: suspended runs (zset);
-- KEYS[6]: ended runs (zset); KEYS[7]: cancelled runs (set, for count); KEYS[8]: attempts hash;
-- KEYS[9]: kinds hash (id -> kind, for kinds other than the default); KEYS[10]: history hash
-- (a held lease's attempt ends cancelled with the reason; one that had expired ended at its
-- expiry); KEYS[11]: the wait hash; KEYS[12]: the deadlines zset. KEYS[2] is the index of the
-- kind ARGV[3].
-- ARGV[1]: encoded run id; ARGV[2]: the reason; ARGV[3]: the kind the client presumes ('' for
-- the default)
-- Returns: {'none'}; {'refused', state} when completed; {'kind', actual} (nothing written: send
-- again with the index of the run's kind); or {'ok', state, owner, expiry, fence,
-- heartbeats, reason, attempts, kind, times, now}, for a run cancelled now or before (then unchanged, its
-- first reason kept). The fence stays and the state is no longer runnable, so a holder's
-- fenced writes, ends and renewals fail as cancelled; the run leaves every live index (a
-- wait for a signal ends: the run is no longer claimable at its deadline) and enters the
-- ended one, for retention. How its last wait ended stays (a signal delivered before the
-- cancel answers its resend as a duplicate).
local r = read_run(KEYS[1], ARGV[1])
if not r then
  return { 'none' }
end
local now = now_micros()
if r.s == 'completed' then
  return { 'refused', r.s }
end
local kind = kind_of(KEYS[9], r.id, r.t)
if r.s ~= 'cancelled' then
  if kind ~= ARGV[3] then
    return { 'kind', kind }
  end
  if r.o ~= '' then
    if tonumber(r.e) <= now then
      end_attempt(KEYS[10], KEYS[8], r, tonumber(r.e), 'expired', nil)
    else
      end_attempt(KEYS[10], KEYS[8], r, now, 'cancelled', ARGV[2])
    end
  end
  r.s = 'cancelled'
  r.o = ''
  r.e = ''
  write_run(KEYS[1], r)
  redis.call('ZREM', KEYS[2], r.m)
  redis.call('ZREM', KEYS[4], r.id)
  redis.call('ZREM', KEYS[5], r.id)
  redis.call('HDEL', KEYS[11], r.id)
  redis.call('ZREM', KEYS[12], r.id)
  redis.call('HSET', KEYS[3], r.id, ARGV[2])
  redis.call('ZADD', KEYS[6], num(now), r.id)
  redis.call('SADD', KEYS[7], r.id)
end
return record_reply('ok', record(r, KEYS[3], KEYS[8], KEYS[9], KEYS[6]), now)
