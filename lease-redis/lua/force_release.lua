-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset); KEYS[3]: failures hash; KEYS[4]:
-- delayed runs (zset); KEYS[5]: attempts hash; KEYS[6]: kinds hash (id -> kind, for kinds
-- other than the default); KEYS[7]: ended runs (zset); KEYS[8]: history hash (a held lease's
-- attempt ends force-released; one that had expired ended at its expiry). KEYS[2] is the index
-- of the kind ARGV[2].
-- ARGV[1]: encoded run id; ARGV[2]: the kind the client presumes ('' for the default)
-- Returns: {'none'}; {'refused', state} when suspended, completed or failed; {'kind', actual}
-- (nothing written: send again with the index of the run's kind); or
-- {'ok', state, owner, expiry, fence, heartbeats, failure, attempts, kind, times, now}. The holder's
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
local kind = kind_of(KEYS[6], r.id, r.t)
if kind ~= ARGV[2] then
  return { 'kind', kind }
end
if r.o ~= '' then
  if tonumber(r.e) <= now then
    end_attempt(KEYS[8], KEYS[5], r, tonumber(r.e), 'expired', nil)
  else
    end_attempt(KEYS[8], KEYS[5], r, now, 'force-released', nil)
  end
end
r.o = ''
r.e = ''
if r.s == 'runnable' then
  r.e = num(now) -- claimable since now (common.lua's record format)
end
write_run(KEYS[1], r)
redis.call('ZREM', KEYS[4], r.id) -- a delay ends
index(KEYS[2], r, now)
if r.s == 'runnable' then
  wake(KEYS[2], now, now)
end
return record_reply('ok', record(r, KEYS[3], KEYS[5], KEYS[6], KEYS[7]), now)
