-- KEYS[1]: runs hash; KEYS[2]: the run's journal (list); KEYS[3]: claimable index (zset)
-- ARGV[1]: operation: 'append', 'release', 'suspend' or 'complete'; ARGV[2]: encoded run id;
-- ARGV[3]: presented fence; ARGV[4]: journal payload (append only; binary-safe)
-- Returns: {'none'}; {'verdict', fence, state, owned ('1' or '0')}; {'ok', seq, now} for
-- append; {'ok'} otherwise
-- Journal entries are stored as '<fence>:<written_at>:<payload>'; seq is the list position.
local op = ARGV[1]
if op ~= 'append' and op ~= 'release' and op ~= 'suspend' and op ~= 'complete' then
  return redis.error_reply('unknown fenced operation ' .. op)
end
local r = read_run(KEYS[1], ARGV[2])
if not r then
  return { 'none' }
end
if not held(r, ARGV[3]) then
  return { 'verdict', r.f, r.s, owned_flag(r) }
end
local now = now_micros()
if op == 'append' then
  local seq = redis.call('RPUSH', KEYS[2], r.f .. ':' .. num(now) .. ':' .. ARGV[4])
  return { 'ok', tostring(seq), num(now) }
end
r.o = ''
r.e = ''
if op == 'release' then
  index(KEYS[3], r, now)
elseif op == 'suspend' then
  r.s = 'suspended'
  redis.call('ZREM', KEYS[3], r.m)
else
  r.s = 'completed'
  redis.call('ZREM', KEYS[3], r.m)
end
write_run(KEYS[1], r)
return { 'ok' }
