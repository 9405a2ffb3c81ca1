-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset); KEYS[3]: this call's record (string:
-- one character per item, '1' if this call ended it, else '0'; expires); KEYS[4]: failures
-- hash; KEYS[5]: ended runs (zset: encoded id scored by when it completed or failed, in µs);
-- KEYS[6]: delayed runs (zset: encoded id scored by its delay's end; for count); KEYS[7]:
-- suspended runs (zset: encoded id scored by when it was suspended; for count); KEYS[8]:
-- attempts hash; KEYS[9]: kinds hash (id -> kind, for kinds other than the default);
-- KEYS[10]: history hash (each ended attempt, as common.lua's push_attempt writes it);
-- KEYS[3i+8]: item i's applied appends (hash, as fenced.lua keeps them; dropped when its lease
-- ends); KEYS[3i+9]: item i's journal (list; used by 'complete-with' only, declared for every
-- item); KEYS[3i+10]: the claimable index of the kind item i's lease names (KEYS[2] is unused)
-- ARGV[1]: how long to keep this call's record, in ms (at least the leases' TTL);
-- ARGV[5i-3]: how item i ends: 'complete', 'complete-with', 'release', 'suspend',
-- 'retry-after', 'attempt-failed' or 'fail'; ARGV[5i-2]: its encoded run id; ARGV[5i-1]: its
-- presented fence; ARGV[5i]: its journal payload ('complete-with'; binary-safe), its delay
-- in ms ('retry-after'), its delay in ms, ':' and its reason ('attempt-failed'), its reason
-- ('fail'), else empty; ARGV[5i+1]: the
-- kind its lease names ('' for the default)
-- A release, a suspend and a retry-after (a snooze) are voluntary: they give the attempt back
-- to the run's budget; 'attempt-failed' is a retry-after that keeps it counted.
-- Returns: one array per item, in order: {'ok'}; {'none'}; or
-- {'verdict', fence, state, owned ('1' or '0')}. Or, when the lease of an item this call would
-- end names another kind than its run's: {'kind', item, actual, item, actual, ...}, and
-- nothing is written (send again with the right indexes).
-- Each item is judged on its own, as fenced.lua judges one write; a 'complete-with' appends
-- '<fence>:<written_at>:<payload>' to the run's journal and completes the run, or does neither.
-- A resend of this very call finds its record: an item it ended answers 'ok' again and
-- changes nothing. (An end never applies twice anyway: the lease it ended is no longer held.
-- The record only lets a resend learn its first answer; if it expired or was evicted, the
-- resend answers LeaseEnded under the item's own fence, which callers recognise.)
for i = 2, #ARGV, 5 do
  local op = ARGV[i]
  if op ~= 'complete' and op ~= 'complete-with' and op ~= 'release' and op ~= 'suspend'
    and op ~= 'retry-after' and op ~= 'attempt-failed' and op ~= 'fail' then
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
    local kind = kind_of(KEYS[9], r.id)
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
local applied = {}
local earlier -- this call's record from an earlier delivery, read at most once
local fresh = false -- whether this delivery ended any lease
item = 0
for i = 2, #ARGV, 5 do
  item = item + 1
  local op = ARGV[i]
  local r = runs[item]
  local zkey = KEYS[3 * item + 10]
  applied[item] = '0'
  if not r then
    out[#out + 1] = { 'none' }
  elseif r.f ~= ARGV[i + 2] then
    out[#out + 1] = { 'verdict', r.f, r.s, owned_flag(r) }
  elseif not held(r, ARGV[i + 2]) then
    -- Ended under this fence: by this very call (a resend), or otherwise. A held lease needs
    -- no such look-up: a call that ended it would have left it ended.
    earlier = earlier or redis.call('GET', KEYS[3]) or ''
    if string.sub(earlier, item, item) == '1' then
      applied[item] = '1'
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
    elseif op == 'suspend' then
      outcome = 'suspended'
    elseif op == 'attempt-failed' then
      outcome = 'retried'
      delay, err = string.match(ARGV[i + 3], '^(%d+):(.*)$')
    elseif op == 'fail' then
      outcome = 'failed'
      err = ARGV[i + 3]
    end
    end_attempt(KEYS[10], KEYS[8], r, now, outcome, err)
    r.o = ''
    r.e = ''
    if op == 'release' then
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
      redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', num(now)) -- delays over: claimable
      redis.call('ZADD', KEYS[6], num(at), r.id)
    else
      if op == 'complete-with' then
        now = now or now_micros()
        redis.call('RPUSH', KEYS[3 * item + 9], r.f .. ':' .. num(now) .. ':' .. ARGV[i + 3])
      end
      redis.call('ZREM', zkey, r.m)
      if op ~= 'suspend' then
        now = now or now_micros()
        redis.call('ZADD', KEYS[5], num(now), r.id) -- ended: for retention
      end
      if op == 'suspend' then
        r.s = 'suspended'
        now = now or now_micros()
        redis.call('ZADD', KEYS[7], num(now), r.id)
      elseif op == 'fail' then
        r.s = 'failed'
        redis.call('HSET', KEYS[4], r.id, ARGV[i + 3])
      else
        r.s = 'completed'
      end
    end
    if op == 'release' or op == 'suspend' or op == 'retry-after' then
      refund(KEYS[8], r.id)
    end
    write_run(KEYS[1], r)
    -- The lease is over: nothing more can be appended under its fence.
    redis.call('DEL', KEYS[3 * item + 8])
    applied[item] = '1'
    fresh = true
    out[#out + 1] = { 'ok' }
  end
end
if fresh then
  -- Every item this call has ended, by this delivery or an earlier one.
  redis.call('SET', KEYS[3], table.concat(applied), 'PX', ARGV[1])
end
return out
