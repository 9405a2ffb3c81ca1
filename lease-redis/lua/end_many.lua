-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset); KEYS[3..]: the journal (list) of each
-- 'complete-with' item, in item order
-- ARGV[4i-3]: how item i ends: 'complete', 'complete-with', 'release' or 'suspend';
-- ARGV[4i-2]: its encoded run id; ARGV[4i-1]: its presented fence; ARGV[4i]: its journal
-- payload ('complete-with' only, else empty; binary-safe)
-- Returns: one array per item, in order: {'ok'}; {'none'}; or
-- {'verdict', fence, state, owned ('1' or '0')}
-- Each item is judged on its own, as fenced.lua judges one write; a 'complete-with' appends
-- '<fence>:<written_at>:<payload>' to the run's journal and completes the run, or does neither.
for i = 1, #ARGV, 4 do
  local op = ARGV[i]
  if op ~= 'complete' and op ~= 'complete-with' and op ~= 'release' and op ~= 'suspend' then
    return redis.error_reply('unknown end ' .. op) -- before any write: nothing to undo
  end
end
local now
local out = {}
local journal = 2
for i = 1, #ARGV, 4 do
  local op = ARGV[i]
  if op == 'complete-with' then
    journal = journal + 1
  end
  local r = read_run(KEYS[1], ARGV[i + 1])
  if not r then
    out[#out + 1] = { 'none' }
  elseif not held(r, ARGV[i + 2]) then
    out[#out + 1] = { 'verdict', r.f, r.s, owned_flag(r) }
  else
    if op == 'release' then
      now = now or now_micros()
      index(KEYS[2], r, now)
    else
      if op == 'complete-with' then
        now = now or now_micros()
        redis.call('RPUSH', KEYS[journal], r.f .. ':' .. num(now) .. ':' .. ARGV[i + 3])
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
    out[#out + 1] = { 'ok' }
  end
end
return out
