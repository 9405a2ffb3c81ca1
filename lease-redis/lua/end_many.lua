-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset); KEYS[2i+1]: item i's applied calls
-- (hash, as fenced.lua keeps them); KEYS[2i+2]: item i's journal (list; used by
-- 'complete-with' only, declared for every item)
-- ARGV[1]: this call's id; ARGV[4i-2]: how item i ends: 'complete', 'complete-with',
-- 'release' or 'suspend'; ARGV[4i-1]: its encoded run id; ARGV[4i]: its presented fence;
-- ARGV[4i+1]: its journal payload ('complete-with' only, else empty; binary-safe)
-- Returns: one array per item, in order: {'ok'}; {'none'}; or
-- {'verdict', fence, state, owned ('1' or '0')}
-- Each item is judged on its own, as fenced.lua judges one write; a 'complete-with' appends
-- '<fence>:<written_at>:<payload>' to the run's journal and completes the run, or does neither.
-- An item whose run records this call id under its fence was ended by this very call already
-- (a resend): it answers 'ok' again and changes nothing.
for i = 2, #ARGV, 4 do
  local op = ARGV[i]
  if op ~= 'complete' and op ~= 'complete-with' and op ~= 'release' and op ~= 'suspend' then
    return redis.error_reply('unknown end ' .. op) -- before any write: nothing to undo
  end
end
local call = ARGV[1]
local now
local out = {}
local item = 0
for i = 2, #ARGV, 4 do
  item = item + 1
  local op = ARGV[i]
  local calls = KEYS[2 * item + 1]
  local r = read_run(KEYS[1], ARGV[i + 1])
  if not r then
    out[#out + 1] = { 'none' }
  elseif r.f ~= ARGV[i + 2] then
    out[#out + 1] = { 'verdict', r.f, r.s, owned_flag(r) }
  elseif not held(r, ARGV[i + 2]) then
    -- Ended under this fence: by this very call (a resend), or otherwise. A held lease needs
    -- no such look-up: a call that ended it would have left it ended.
    if redis.call('HGET', calls, 'f') == r.f and redis.call('HEXISTS', calls, call) == 1 then
      out[#out + 1] = { 'ok' }
    else
      out[#out + 1] = { 'verdict', r.f, r.s, owned_flag(r) }
    end
  else
    if op == 'release' then
      now = now or now_micros()
      index(KEYS[2], r, now)
    else
      if op == 'complete-with' then
        now = now or now_micros()
        redis.call('RPUSH', KEYS[2 * item + 2], r.f .. ':' .. num(now) .. ':' .. ARGV[i + 3])
      end
      redis.call('ZREM', KEYS[2], r.m)
      if op == 'suspend' then
        r.s = 'suspended'
      else
        r.s = 'completed'
      end
    end
    r.o = ''
    r.e = ''
    write_run(KEYS[1], r)
    -- The lease is over: only the end's own call is kept, to answer its resend.
    redis.call('DEL', calls)
    redis.call('HSET', calls, 'f', r.f, call, '')
    out[#out + 1] = { 'ok' }
  end
end
return out
