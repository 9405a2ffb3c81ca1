-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset); KEYS[3]: all run ids (zset, score 0,
-- by encoded id); KEYS[4]: creation counter; KEYS[5]: tombstones (hash: purged id -> its
-- last fence); KEYS[6]: attempts hash
-- ARGV[1]: encoded run id
-- Returns: {'exists'} if the run exists; else {'ok', now, fence} (0, or a purged id's last
-- fence: its next claim continues above it)
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return { 'exists' }
end
local now = now_micros()
local order = redis.call('INCR', KEYS[4])
-- Zero-padded creation order first: equal scores then sort by creation, oldest first.
local member = string.format('%016x', order) .. ARGV[1]
local fence = redis.call('HGET', KEYS[5], ARGV[1]) or '0'
write_run(KEYS[1], { id = ARGV[1], s = 'runnable', f = fence, h = '0', e = '', m = member, o = '' })
index(KEYS[2], { f = fence, m = member }, now)
redis.call('ZADD', KEYS[3], 0, ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1]) -- a fresh budget, also for a purged id created again
return { 'ok', num(now), fence }
