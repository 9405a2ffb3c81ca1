-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset); KEYS[3]: all run ids (zset, score 0,
-- by encoded id); KEYS[4]: creation counter
-- ARGV[1]: encoded run id
-- Returns: {'exists'} if the run exists; else {'ok', now}
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return { 'exists' }
end
local now = now_micros()
local order = redis.call('INCR', KEYS[4])
-- Zero-padded creation order first: equal scores then sort by creation, oldest first.
local member = string.format('%016x', order) .. ARGV[1]
write_run(KEYS[1], { id = ARGV[1], s = 'runnable', f = '0', h = '0', e = '', m = member, o = '' })
redis.call('ZADD', KEYS[2], num(now), member)
redis.call('ZADD', KEYS[3], 0, ARGV[1])
return { 'ok', num(now) }
