-- KEYS[1]: runs hash; KEYS[2]: unused (the default kind's claimable index); KEYS[3]: failures
-- hash; KEYS[4]: ended runs (zset: encoded id scored by when it completed or failed, in µs);
-- KEYS[5]: delayed runs (zset: encoded id scored by its delay's end; for count); KEYS[6]:
-- suspended runs (zset: encoded id scored by when it was suspended; for count); KEYS[7]:
-- attempts hash; KEYS[8]: kinds hash (id -> kind, for kinds other than the default); KEYS[9]:
-- history hash (each ended attempt, as common.lua's push_attempt writes it, with this call's
-- id after it); KEYS[10]: the wait hash; KEYS[11]: the deadlines zset; KEYS[12]: the resumed
-- hash (record.lua describes the three); KEYS[2i+11]: item i's journal (list; used by
-- 'complete-with' only, declared for every item); KEYS[2i+12]: the claimable index of the kind
-- item i's lease names
-- ARGV[1]: this call's id;
-- ARGV[5i-3]: how item i ends: 'complete', 'complete-with', 'release', 'suspend',
-- 'await-signal', 'retry-after', 'attempt-failed' or 'fail'; ARGV[5i-2]: its encoded run id;
-- ARGV[5i-1]: its presented fence; ARGV[5i]: its journal payload ('complete-with';
-- binary-safe), its delay in ms ('retry-after'), its delay in ms, ':' and its reason
-- ('attempt-failed'), its reason ('fail'), its timeout in ms ('' for none), ':' and the
-- signal's name ('await-signal'), else empty; ARGV[5i+1]: the kind its lease names ('' for the
-- default)
-- A release, a suspend, a wait and a retry-after (a snooze) are voluntary: they give the
-- attempt back to the run's budget; 'attempt-failed' is a retry-after that keeps it counted.
-- 'await-signal' suspends the run as 'suspend' does, and begins its wait (record.lua): the
-- wait of the lease's fence, until now plus the timeout; the run's last wait's end is cleared,
-- its record flagged 'w', and, with a deadline, its member stays in the claimable index scored
-- by the deadline (a wake-up for then), so that claim_next takes it when the wait times out.
-- Unless a signal for its name came while the lease held the run (signal.lua kept it in the
-- resumed field under the lease's fence): then the wait is answered as it begins, and the run
-- is given back as a release gives it, claimable now, with the signal and a fresh budget.
-- Returns: one array per item, in order: {'ok'}; {'none'}; or
-- {'verdict', fence, state, owned ('1' or '0')}. Or, when the lease of an item this call would
-- end names another kind than its run's: {'kind', item, actual, item, actual, ...}, and
-- nothing is written (send again with the right indexes).
-- Each item is judged on its own, as fenced.lua judges one write; a 'complete-with' appends
-- '<fence>:<written_at>:<payload>' to the run's journal and completes the run, or does neither.
-- A resend of this very call finds, for each item it ended, this call's id in the attempt it
-- wrote, the last of the run's history under the item's fence: it answers 'ok' again and
-- changes nothing. Nothing after an end writes the run's history without a claim, which moves
-- the fence, so the answer lasts as long as a resend can come, in no key of its own. (An end
-- never applies twice anyway: the lease it ended is no longer held.) A run's applied appends
-- (fenced.lua) are left to the next lease's first append, which drops them, or to purge: a
-- resent append of the ended lease still answers its first result.
for i = 2, #ARGV, 5 do
  local op = ARGV[i]
  if op ~= 'complete' and op ~= 'complete-with' and op ~= 'release' and op ~= 'suspend'
    and op ~= 'await-signal' and op ~= 'retry-after' and op ~= 'attempt-failed' and op ~= 'fail' then
    return redis.error_reply('unknown end ' .. op) -- before any write: nothing to undo
  end
end
-- First every item's verdict, and the kinds of the leases to end, before any write.
local runs = {}
local wrong = { 'kind' }
local item = 0
for i = 2, #ARGV, 5 do
  item = item + 1
  local r = read_run(KEYS[1], ARGV[i + 1])
  runs[item] = r or false
  if r and held(r, ARGV[i + 2]) then
    local kind = kind_of(KEYS[8], r.id, r.t)
    if kind ~= ARGV[i + 4] then
      wrong[#wrong + 1] = tostring(item)
      wrong[#wrong + 1] = kind
    end
  end
end
if #wrong > 1 then
  return wrong
end
local now
local out = {}
item = 0
for i = 2, #ARGV, 5 do
  item = item + 1
  local op = ARGV[i]
  local r = runs[item]
  local zkey = KEYS[2 * item + 12]
  if not r then
    out[#out + 1] = { 'none' }
  elseif r.f ~= ARGV[i + 2] then
    out[#out + 1] = { 'verdict', r.f, r.s, owned_flag(r) }
  elseif not held(r, ARGV[i + 2]) then
    -- Ended under this fence: by this very call (a resend), or otherwise. A held lease needs
    -- no such look-up: a call that ended it would have left it ended.
    if ended_by(KEYS[9], r.id, r.f, ARGV[1]) then
      out[#out + 1] = { 'ok' }
    else
      out[#out + 1] = { 'verdict', r.f, r.s, owned_flag(r) }
    end
  else
    -- The attempt's end, before the owner is cleared and any refund.
    now = now or now_micros()
    local delay, err = ARGV[i + 3], nil
    local outcome = 'completed'
    if op == 'release' or op == 'retry-after' then
      outcome = 'released'
    elseif op == 'suspend' or op == 'await-signal' then
      outcome = 'suspended'
    elseif op == 'attempt-failed' then
      outcome = 'retried'
      delay, err = string.match(ARGV[i + 3], '^(%d+):(.*)$')
    elseif op == 'fail' then
      outcome = 'failed'
      err = ARGV[i + 3]
    end
    end_attempt(KEYS[9], KEYS[7], r, now, outcome, err, ARGV[1])
    -- A wait a signal answered while this lease ran.
    local answered = false
    if op == 'await-signal' and waited(r.t) then
      local early = redis.call('HGET', KEYS[12], r.id)
      local name = string.match(ARGV[i + 3], '^%d*:(.*)$')
      if early then
        local ef, en = string.match(early, '^S:(%d+):%d+:([^\31]*)\31')
        answered = ef == r.f and en == name
      end
    end
    r.o = ''
    r.e = ''
    if op == 'release' or answered then
      now = now or now_micros()
      r.e = num(now) -- claimable since now (common.lua's record format)
      index(zkey, r, now)
      wake(zkey, now, now)
    elseif op == 'retry-after' or op == 'attempt-failed' then
      -- Claimable from the delay's end, on this server's clock: the index and the record
      -- (claim checks the record) both say so.
      now = now or now_micros()
      local at = now + tonumber(delay) * 1000
      r.e = num(at)
      index(zkey, r, at)
      wake(zkey, at, now)
      redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', num(now)) -- delays over: claimable
      redis.call('ZADD', KEYS[5], num(at), r.id)
    else
      if op == 'complete-with' then
        now = now or now_micros()
        redis.call('RPUSH', KEYS[2 * item + 11], r.f .. ':' .. num(now) .. ':' .. ARGV[i + 3])
      end
      local suspends = op == 'suspend' or op == 'await-signal'
      redis.call('ZREM', zkey, r.m)
      if not suspends then
        now = now or now_micros()
        redis.call('ZADD', KEYS[4], num(now), r.id) -- ended: for retention
      end
      if suspends then
        r.s = 'suspended'
        now = now or now_micros()
        redis.call('ZADD', KEYS[6], num(now), r.id)
        if op == 'await-signal' then
          local ms, name = string.match(ARGV[i + 3], '^(%d*):(.*)$')
          local deadline = ''
          if ms ~= '' then
            deadline = num(now + tonumber(ms) * 1000)
            if r.f ~= FENCE_MAX then
              redis.call('ZADD', zkey, deadline, r.m)
              redis.call('ZADD', KEYS[11], deadline, r.id)
              wake(zkey, tonumber(deadline), now)
            end
          end
          redis.call('HSET', KEYS[10], r.id, r.f .. ':' .. deadline .. ':' .. name)
          redis.call('HDEL', KEYS[12], r.id)
          r.t = with_waited(r.t)
        end
      elseif op == 'fail' then
        r.s = 'failed'
        redis.call('HSET', KEYS[3], r.id, ARGV[i + 3])
      else
        r.s = 'completed'
      end
    end
    if answered then
      redis.call('HDEL', KEYS[7], r.id) -- a fresh budget
    elseif op == 'release' or op == 'suspend' or op == 'await-signal' or op == 'retry-after' then
      refund(KEYS[7], r.id)
    end
    write_run(KEYS[1], r)
    out[#out + 1] = { 'ok' }
  end
end
return out
