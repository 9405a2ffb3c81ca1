-- KEYS[1]: ended runs (zset: encoded id scored by when it completed or failed, in µs)
-- ARGV[1]: age in ms; ARGV[2]: most ids
-- Returns: the encoded ids of up to ARGV[2] runs that ended at least ARGV[1] ms ago, oldest
-- end first (candidates: purge.lua checks each again with its keys declared).
local cutoff = now_micros() - tonumber(ARGV[1]) * 1000
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', num(cutoff), 'LIMIT', 0, tonumber(ARGV[2]))
