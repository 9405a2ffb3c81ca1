-- KEYS[1]: every class but the default (set); KEYS[2]: the default class's claimable index
-- (zset); KEYS[3..]: the claimable index of each of those classes, in the order the client read
-- them
-- ARGV[1]: how many classes' indexes follow KEYS[2]
-- Returns: {'kinds'} when the classes set holds another number of classes than ARGV[1] (read
-- it again); else, per index from KEYS[2] on, {runnable, claimable, lag}: its size, how many
-- are due (claimable now), and how long ago, in microseconds, its lowest due score became
-- claimable ('' for none). O(log n) per class, whatever the number of runs; the client adds
-- the classes of a kind up. A run waiting for a signal until a deadline keeps its member in
-- its class's index, scored by the deadline (claim_next takes it then, timed out): it is
-- counted here as runnable, and as claimable once its wait timed out, unlike count.lua, which
-- tells the waits apart by the deadlines zset (this script has no such set per class).
if redis.call('SCARD', KEYS[1]) ~= tonumber(ARGV[1]) then
  return { 'kinds' }
end
local now = now_micros()
local out = {}
for i = 2, tonumber(ARGV[1]) + 2 do
  local due = redis.call('ZCOUNT', KEYS[i], '-inf', now)
  local lag = ''
  if due > 0 then
    local first = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
    lag = num(now - tonumber(first[2]))
  end
  out[#out + 1] = tostring(redis.call('ZCARD', KEYS[i]))
  out[#out + 1] = tostring(due)
  out[#out + 1] = lag
end
return out
