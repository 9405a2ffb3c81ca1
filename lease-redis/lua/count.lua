-- KEYS[1]: claimable index (zset); KEYS[2]: delayed runs (zset); KEYS[3]: suspended runs
-- (zset); KEYS[4]: ended runs (zset); KEYS[5]: failures hash (failed and cancelled runs);
-- KEYS[6]: cancelled runs (set)
-- ARGV: none
-- Returns: {claimable, held, delayed, suspended, completed, failed, cancelled}, each from an index's
-- size or a range count: O(log n), whatever the number of runs. The claimable index holds
-- every runnable run, scored by when it is claimable (now or before: claimable; later: held
-- until its expiry, or delayed until its delay's end); a delayed run stays in the delayed set
-- after its delay, with a score that no longer counts.
local now = num(now_micros())
local claimable = redis.call('ZCOUNT', KEYS[1], '-inf', now)
local later = redis.call('ZCARD', KEYS[1]) - claimable
local delayed = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
local cancelled = redis.call('SCARD', KEYS[6])
local ended_with_reason = redis.call('HLEN', KEYS[5])
local failed = ended_with_reason - cancelled
if failed < 0 then failed = 0 end
local held = later - delayed
if held < 0 then held = 0 end
local completed = redis.call('ZCARD', KEYS[4]) - ended_with_reason
if completed < 0 then completed = 0 end
return { tostring(claimable), tostring(held), tostring(delayed),
  tostring(redis.call('ZCARD', KEYS[3])), tostring(completed), tostring(failed),
  tostring(cancelled) }
