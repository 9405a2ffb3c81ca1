-- KEYS[1]: the queues hash (src/keys.rs)
-- ARGV: none
-- Returns: flat {name, flag, µs, name, ...}: every queue ever paused or resumed, with its state
-- ('1' paused, '0' not) and since when, on this server's clock; the caller sorts and bounds.
local out = {}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local v = fields[i + 1]
  out[#out + 1] = fields[i]
  out[#out + 1] = string.sub(v, 1, 1)
  out[#out + 1] = string.sub(v, 3)
end
return out
