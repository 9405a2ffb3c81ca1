-- KEYS[1]: runs hash; KEYS[2]: the run's applied calls (hash, as fenced.lua keeps them);
-- KEYS[3]: claimable index (zset); KEYS[4]: the run's journal (list); KEYS[5]: ended runs
-- (zset, for retention); KEYS[6]: suspended runs (zset, for count); KEYS[7]: attempts hash (a
-- release or a suspend gives the attempt back); KEYS[8]: kinds hash (id -> kind, for kinds
-- other than the default); KEYS[9]: history hash (an end writes its attempt); KEYS[10..]: the
-- caller's keys (all under the namespace's hash tag).
-- KEYS[3] is the index of the kind ARGV[6].
-- ARGV[1]: encoded run id; ARGV[2]: presented fence; ARGV[3]: this call's id; ARGV[4]: how the
-- lease ends after the snippet: '' (it does not), 'complete', 'complete-with', 'release' or
-- 'suspend'; ARGV[5]: the journal payload of a 'complete-with', else ''; ARGV[6]: the kind the
-- lease names ('' for the default); ARGV[7..]: the caller's arguments
-- Returns: {'none'}; {'verdict', fence, state, owned ('1' or '0')}; {'kind', actual} for an
-- end whose lease names another kind than its run's (nothing run or written: send again with
-- the right index); or {'ok', result} where
-- result is what the caller's snippet returned (the caller's snippet follows this prelude,
-- wrapped in a function that sees its own KEYS and ARGV, without the adapter's). A call whose
-- id is recorded under the presented fence ran already (a resend): it answers the snippet's
-- first result, kept with cmsgpack, and runs nothing.
-- The adapter's part comes first and last: the fence check before the snippet (a refused
-- fence runs nothing) and the lease's end after it (a snippet that raises an error leaves the
-- lease held; what it wrote before the error stays, as Redis never rolls a script back).
local lease_run = read_run(KEYS[1], ARGV[1])
if not lease_run then
  return { 'none' }
end
if lease_run.f ~= ARGV[2] then
  return { 'verdict', lease_run.f, lease_run.s, owned_flag(lease_run) }
end
local lease_calls = redis.call('HMGET', KEYS[2], 'f', ARGV[3])
if lease_calls[1] == lease_run.f and lease_calls[2] then
  return { 'ok', cmsgpack.unpack(lease_calls[2]) }
end
if not held(lease_run, ARGV[2]) then
  return { 'verdict', lease_run.f, lease_run.s, owned_flag(lease_run) }
end
local lease_op = ARGV[4]
if lease_op ~= '' and lease_op ~= 'complete' and lease_op ~= 'complete-with'
  and lease_op ~= 'release' and lease_op ~= 'suspend' then
  return redis.error_reply('unknown end ' .. lease_op) -- before any write: nothing to undo
end
if lease_op ~= '' then
  local kind = kind_of(KEYS[8], lease_run.id, lease_run.t)
  if kind ~= ARGV[6] then
    return { 'kind', kind }
  end
end
-- Ends the lease as ARGV[4] says, after the snippet, and records this call's result in the
-- run's applied calls (KEYS[2]): added to those of the same fence, which stay (a resend of any
-- of them, even after this call ended the lease, answers its first result); the calls of an
-- earlier fence are dropped first.
local function lease_record(result)
  local now
  if lease_op ~= '' then
    -- The attempt's end, before the owner is cleared and any refund.
    now = now_micros()
    local outcome = 'completed'
    if lease_op == 'release' then
      outcome = 'released'
    elseif lease_op == 'suspend' then
      outcome = 'suspended'
    end
    end_attempt(KEYS[9], KEYS[7], lease_run, now, outcome, nil)
  end
  if lease_op == 'release' then
    index(KEYS[3], lease_run, now)
    wake(KEYS[3], now, now)
  elseif lease_op ~= '' then
    if lease_op == 'complete-with' then
      redis.call('RPUSH', KEYS[4], lease_run.f .. ':' .. num(now) .. ':' .. ARGV[5])
    end
    redis.call('ZREM', KEYS[3], lease_run.m)
    lease_run.s = (lease_op == 'suspend') and 'suspended' or 'completed'
    now = now or now_micros()
    if lease_run.s == 'completed' then
      redis.call('ZADD', KEYS[5], num(now), lease_run.id)
    else
      redis.call('ZADD', KEYS[6], num(now), lease_run.id)
    end
  end
  if lease_op ~= '' then
    lease_run.o = ''
    -- An unowned runnable run's expiry field: since when it is claimable (common.lua).
    lease_run.e = (lease_op == 'release') and num(now) or ''
    write_run(KEYS[1], lease_run)
  end
  if lease_op == 'release' or lease_op == 'suspend' then
    refund(KEYS[7], lease_run.id)
  end
  if lease_calls[1] ~= lease_run.f then
    redis.call('DEL', KEYS[2]) -- the calls of an earlier fence
  end
  redis.call('HSET', KEYS[2], 'f', lease_run.f, ARGV[3], cmsgpack.pack(result))
  return result
end
local lease_result = (function(KEYS, ARGV)
