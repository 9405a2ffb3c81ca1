-- KEYS[1]: claimable index (zset); KEYS[2..n+1]: run hashes, one per lease
-- ARGV[2i-1]: presented fence of lease i; ARGV[2i]: its TTL in milliseconds
-- Returns: one array per lease, in order: {'ok', expiry}; {'none'}; or
-- {'verdict', fence, state, owned ('1' or '0')}
local now = now_micros()
local out = {}
for i = 2, #KEYS do
  local presented = ARGV[2 * (i - 1) - 1]
  local ttl = tonumber(ARGV[2 * (i - 1)])
  local r = read_run(KEYS[i])
  if not r then
    out[#out + 1] = { 'none' }
  elseif not held(r, presented) then
    out[#out + 1] = { 'verdict', r.f, r.s, owned_flag(r) }
  else
    local expires = now + ttl * 1000
    redis.call('HSET', KEYS[i], 'e', num(expires))
    redis.call('HINCRBY', KEYS[i], 'h', 1)
    index(KEYS[1], r, r.f, expires)
    out[#out + 1] = { 'ok', num(expires) }
  end
end
return out
