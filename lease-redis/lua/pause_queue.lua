-- KEYS[1]: the queues hash (src/keys.rs)
-- ARGV[1]: the queue's name; ARGV[2]: '1' to pause it, '0' to resume it
-- Returns: {flag, µs}: the queue's state as stored ('1' paused, '0' not) and since when, on this
-- server's clock. Sending the same change again keeps its first time and writes nothing.
-- claim_next.lua reads the field in its own atomic step, so no claim that runs after this
-- script takes a run of a paused queue.
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current and string.sub(current, 1, 1) == ARGV[2] then
  return { ARGV[2], string.sub(current, 3) }
end
local now = num(now_micros())
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. now)
return { ARGV[2], now }
