-- KEYS[1]: ended runs (zset: encoded id scored by when it completed, failed or was cancelled, in µs)
-- ARGV[1]: age in ms
-- Returns: {count}: how many runs ended at least ARGV[1] ms ago (O(log n)).
local cutoff = now_micros() - tonumber(ARGV[1]) * 1000
return { tostring(redis.call('ZCOUNT', KEYS[1], '-inf', num(cutoff))) }
