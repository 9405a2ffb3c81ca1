-- KEYS[1]: runs hash; KEYS[2]: the run's journal (list); KEYS[3]: claimable index (zset);
-- KEYS[4]: the run's applied calls (hash: 'f' = their fence, call id -> first result; appends);
-- KEYS[5]: ended runs (zset: encoded id scored by when it completed, in µs; for retention);
-- KEYS[6]: suspended runs (zset, for count); KEYS[7]: attempts hash (a release or a suspend
-- gives the attempt back); KEYS[8]: kinds hash (id -> kind, for kinds other than the
-- default); KEYS[9]: history hash (an end writes its attempt, as common.lua's push_attempt
-- does, with this call's id after it). KEYS[3] is the index of the kind ARGV[6].
-- ARGV[1]: operation: 'append', 'release', 'suspend' or 'complete'; ARGV[2]: encoded run id;
-- ARGV[3]: presented fence; ARGV[4]: journal payload (append only; binary-safe); ARGV[5]:
-- this call's id; ARGV[6]: the kind the lease names ('' for the default)
-- Returns: {'none'}; {'verdict', fence, state, owned ('1' or '0')}; {'ok', seq, now} for
-- append; {'kind', actual} for an end whose lease names another kind than its run's (nothing
-- written: send again with the right index); {'ok'} otherwise. A call whose id is recorded
-- under the presented fence was applied already (a resend): it answers its first result and
-- changes nothing. An append's id is in the run's applied calls; an end's is the last field
-- of the attempt it wrote, the history's last entry: nothing after the end can write the run's
-- history without a claim, which moves the fence, so the record lasts as long as a resend can
-- be answered, and costs no key of its own.
-- Journal entries are stored as '<fence>:<written_at>:<payload>'; seq is the list position.
-- A hot script, run without the common.lua prelude (whose helpers every call would build
-- again): the record's format and the history's come from record.lua, as common.lua's do.
local op = ARGV[1]
if op ~= 'append' and op ~= 'release' and op ~= 'suspend' and op ~= 'complete' then
  return redis.error_reply('unknown fenced operation ' .. op)
end
local v = redis.call('HGET', KEYS[1], ARGV[2])
if not v then
  return { 'none' }
end
local s, f, h, _, m, o, times = string.match(v, RECORD)
if not s then
  return redis.error_reply('malformed run record for ' .. ARGV[2])
end
if f ~= ARGV[3] then
  return { 'verdict', f, s, o == '' and '0' or '1' }
end
-- The fence check comes first: a resend under a fence that has moved is refused like any
-- stale write. An append looks itself up whatever the lease's state; an end only when the
-- lease is no longer held (a call that ended it would have left it ended), in its own record.
local ended = s ~= 'runnable' or o == ''
local calls = { false, false }
if op == 'append' then
  calls = redis.call('HMGET', KEYS[4], 'f', ARGV[5])
  if calls[1] == f and calls[2] then
    local seq, at = string.match(calls[2], '^(%d+):(%d+)$')
    return { 'ok', seq, at }
  end
elseif ended then
  -- The history's last entry ends with this call's id when this call wrote it.
  if ended_by(KEYS[9], ARGV[2], f, ARGV[5]) then
    return { 'ok' }
  end
end
if ended then
  return { 'verdict', f, s, o == '' and '0' or '1' }
end
if op == 'append' then
  local t = redis.call('TIME')
  local now = t[1] .. string.format('%06d', t[2])
  local seq = redis.call('RPUSH', KEYS[2], f .. ':' .. now .. ':' .. ARGV[4])
  if calls[1] ~= f then
    redis.call('DEL', KEYS[4]) -- the calls of an earlier fence
  end
  redis.call('HSET', KEYS[4], 'f', f, ARGV[5], seq .. ':' .. now)
  return { 'ok', tostring(seq), now }
end
-- The record's class, or its flag 'd' (common.lua), spares the kinds look-up.
local kind = string.match(times, '\3(.*)$')
if not kind then
  if string.find(string.match(times, '\2(%l*)') or '', 'd', 1, true) then
    kind = ''
  else
    kind = redis.call('HGET', KEYS[8], ARGV[2]) or ''
  end
end
if kind ~= ARGV[6] then
  return { 'kind', kind }
end
-- The attempt's end into the history (as common.lua's push_attempt writes it; no error here;
-- then this call's id), numbered before any refund. A voluntary end gives the attempt back to
-- the run's budget (never below 0; a 0 keeps its field, as common.lua's refund says), so its
-- number is the counter plus one.
local t = redis.call('TIME')
local at = t[1] .. string.format('%06d', t[2])
local number
if op == 'complete' then
  number = redis.call('HGET', KEYS[7], ARGV[2]) or '0'
else
  local left = redis.call('HINCRBY', KEYS[7], ARGV[2], -1)
  if left < 0 then
    redis.call('HSET', KEYS[7], ARGV[2], '0')
  end
  number = string.format('%d', left + 1)
end
local entry = number .. '\31' .. f .. '\31' .. o .. '\31'
  .. (string.match(times, '^\1%d*,(%d*)') or '') .. '\31' .. at .. '\31'
  .. (op == 'release' and 'released' or op == 'suspend' and 'suspended' or 'completed') .. '\31'
  .. '\31' .. ARGV[5]
redis.call('HSET', KEYS[9], ARGV[2], history_with(redis.call('HGET', KEYS[9], ARGV[2]), entry))
if op == 'release' then
  if f == '9223372036854775807' then
    redis.call('ZREM', KEYS[3], m) -- never claimable again
  else
    -- Claimable from now: behind the runs that waited longer.
    redis.call('ZADD', KEYS[3], at, m)
    -- A wake-up, as common.lua's wake sends it.
    local tag, class = string.match(KEYS[3], '^(.-}):claimable(.*)$')
    if tag then
      redis.pcall('PUBLISH', tag .. ':wake', class .. ' 0') -- as in common.lua: never fails the end
    end
  end
else
  s = op == 'suspend' and 'suspended' or 'completed'
  redis.call('ZREM', KEYS[3], m)
  if s == 'completed' then
    redis.call('ZADD', KEYS[5], at, ARGV[2])
  else
    redis.call('ZADD', KEYS[6], at, ARGV[2])
  end
end
-- Owner and expiry cleared; the times stay (the end's is its score in the ended zset).
-- A released run's expiry field says since when it is claimable (common.lua's record format).
local since = (op == 'release') and at or ''
redis.call('HSET', KEYS[1], ARGV[2], s .. ':' .. f .. ':' .. h .. ':' .. since .. ':' .. m .. ':' .. times)
-- The lease's applied appends stay (a resent append still answers its first result) until the
-- next lease's first append drops them, or purge does: nothing can be appended under an ended
-- lease, held no more.
return { 'ok' }
