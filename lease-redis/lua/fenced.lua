-- KEYS[1]: run hash; KEYS[2]: journal (list); KEYS[3]: claimable index (zset)
-- ARGV[1]: operation: 'append', 'release', 'suspend' or 'complete'; ARGV[2]: presented fence;
-- ARGV[3]: journal payload (append only; binary-safe)
-- Returns: {'none'}; {'verdict', fence, state, owned ('1' or '0')}; {'ok', seq, now} for
-- append; {'ok'} otherwise
-- Journal entries are stored as '<fence>:<written_at>:<payload>'; seq is the list position.
local r = read_run(KEYS[1])
if not r then
  return { 'none' }
end
if not held(r, ARGV[2]) then
  return { 'verdict', r.f, r.s, owned_flag(r) }
end
local now = now_micros()
local op = ARGV[1]
if op == 'append' then
  local seq = redis.call('RPUSH', KEYS[2], r.f .. ':' .. num(now) .. ':' .. ARGV[3])
  return { 'ok', tostring(seq), num(now) }
end
redis.call('HDEL', KEYS[1], 'o', 'e')
if op == 'release' then
  index(KEYS[3], r, r.f, now)
elseif op == 'suspend' then
  redis.call('HSET', KEYS[1], 's', 'suspended')
  redis.call('ZREM', KEYS[3], r.m)
elseif op == 'complete' then
  redis.call('HSET', KEYS[1], 's', 'completed')
  redis.call('ZREM', KEYS[3], r.m)
else
  return redis.error_reply('unknown fenced operation ' .. op)
end
return { 'ok' }
