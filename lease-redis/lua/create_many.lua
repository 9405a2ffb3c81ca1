-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset); KEYS[3]: all run ids (zset, score 0,
-- by encoded id); KEYS[4]: creation counter; KEYS[5]: tombstones (hash: purged id -> its
-- last fence, where a run created again starts); KEYS[6]: attempts hash
-- ARGV[i]: encoded id of run i
-- Returns: one string per run, in order: '1' if created, '0' if it existed (also for the
-- second copy of an id repeated in the batch)
-- The new runs take consecutive creation orders in input order and one claimable instant, so
-- claim_next hands them out in input order.
local out = {}
local seen = {}
local new = {}
for i = 1, #ARGV do
  local id = ARGV[i]
  if seen[id] or redis.call('HEXISTS', KEYS[1], id) == 1 then
    out[i] = '0'
  else
    seen[id] = true
    new[#new + 1] = id
    out[i] = '1'
  end
end
if #new == 0 then
  return out
end
local now = now_micros()
local first = redis.call('INCRBY', KEYS[4], #new) - #new
for n, id in ipairs(new) do
  -- Zero-padded creation order first: equal scores then sort by creation, oldest first.
  local member = string.format('%016x', first + n) .. id
  local fence = redis.call('HGET', KEYS[5], id) or '0'
  write_run(KEYS[1], { id = id, s = 'runnable', f = fence, h = '0', e = '', m = member, o = '' })
  index(KEYS[2], { f = fence, m = member }, now)
  redis.call('ZADD', KEYS[3], 0, id)
  redis.call('HDEL', KEYS[6], id) -- a fresh budget
end
return out
