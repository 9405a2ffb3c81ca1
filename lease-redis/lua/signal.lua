-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset) of the kind ARGV[5]; KEYS[3]: the wait
-- hash; KEYS[4]: the deadlines zset; KEYS[5]: the resumed hash (record.lua describes the
-- three); KEYS[6]: suspended runs (zset, for count); KEYS[7]: attempts hash; KEYS[8]: kinds
-- hash (id -> kind, for kinds other than the default)
-- ARGV[1]: encoded run id; ARGV[2]: the signal's name; ARGV[3]: the fence of the wait it
-- answers (its token's); ARGV[4]: its payload (binary-safe); ARGV[5]: the kind the client
-- presumes ('' for the default)
-- Returns: {'none'}; {'refused', state, reason} (reason lease_core::SignalRefusal's name;
-- nothing written); {'duplicate'} (this delivery was made before: nothing written); {'kind',
-- actual} (nothing written: send again with the index of the run's kind); or {'ok', now}.
-- lease_core::signal::signal_verdict, in one atomic step: first the run's last wait's end, if
-- it is of this wait and name (the same payload again is a duplicate; another is refused as
-- already signalled; a timeout refuses as timed out), whatever the run did since, until it
-- waits again; then a fence above the run's is a wait it never had; then its wait: of this
-- fence, for another name, or past its deadline, refused; of a later fence, refused as an
-- earlier wait; none: while the lease of the token's fence holds the run (its handler took the
-- token and has not ended yet), the signal is kept as that lease's answer, once, the run left
-- as it is (end_many.lua answers the wait as it begins); else not waiting. A delivery ends the
-- wait: the run is runnable and
-- claimable now, with a fresh attempt budget, and its resumed field holds the signal, which
-- the leases of its next claims carry until it waits again.
local r = read_run(KEYS[1], ARGV[1])
if not r then
  return { 'none' }
end
local function refuse(reason)
  return { 'refused', r.s, reason }
end
-- Whether fence `a` is above fence `b` (decimal strings without leading zeros).
local function above(a, b)
  return a ~= b and fence_max(a, b) == a
end
local now = now_micros()
local answered_fence = nil
if waited(r.t) then
  local ended = redis.call('HGET', KEYS[5], r.id)
  if ended then
    local how, ef, rest = string.match(ended, '^(%u):(%d+):%d+:(.*)$')
    if not how then
      return redis.error_reply('malformed resumed field for ' .. r.id)
    end
    local name, payload = rest, nil
    if how == 'S' then
      name, payload = string.match(rest, '^([^\31]*)\31(.*)$')
    end
    answered_fence = ef
    if ef == ARGV[3] and name == ARGV[2] then
      if how ~= 'S' then
        return refuse('timed_out')
      elseif payload == ARGV[4] then
        return { 'duplicate' }
      end
      return refuse('already_signalled')
    end
  end
end
if above(ARGV[3], r.f) then
  return refuse('unknown_wait')
end
local wf, wd, wn
if r.s == 'suspended' then
  wf, wd, wn = string.match(redis.call('HGET', KEYS[3], r.id) or '', WAIT)
end
if not wf and r.s == 'runnable' and r.o ~= '' and r.f == ARGV[3] then
  -- Early: kept for the holder's wait, once.
  if answered_fence == ARGV[3] then
    return refuse('other_signal')
  end
  redis.call('HSET', KEYS[5], r.id, 'S:' .. r.f .. ':' .. num(now) .. ':' .. ARGV[2] .. '\31' .. ARGV[4])
  r.t = with_waited(r.t)
  write_run(KEYS[1], r)
  return { 'early', num(now) }
end
if not wf then
  return refuse('not_waiting')
elseif above(wf, ARGV[3]) then
  return refuse('earlier_wait')
elseif wf ~= ARGV[3] then
  return refuse('not_waiting')
elseif wn ~= ARGV[2] then
  return refuse('other_signal')
elseif wd ~= '' and tonumber(wd) <= now then
  return refuse('timed_out')
end
local kind = kind_of(KEYS[8], r.id, r.t)
if kind ~= ARGV[5] then
  return { 'kind', kind }
end
redis.call('HSET', KEYS[5], r.id, 'S:' .. wf .. ':' .. num(now) .. ':' .. wn .. '\31' .. ARGV[4])
redis.call('HDEL', KEYS[3], r.id)
redis.call('ZREM', KEYS[4], r.id)
redis.call('ZREM', KEYS[6], r.id)
redis.call('HDEL', KEYS[7], r.id) -- a fresh budget
r.s = 'runnable'
r.e = num(now) -- claimable since now (common.lua's record format)
write_run(KEYS[1], r)
index(KEYS[2], r, now)
wake(KEYS[2], now, now)
return { 'ok', num(now) }
