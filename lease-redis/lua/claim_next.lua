-- KEYS[1]: claimable index (zset, score = instant claimable in microseconds, member = 16 hex
-- digits of creation order followed by the encoded run id)
-- ARGV[1]: run hash key prefix (same hash tag as KEYS[1]); ARGV[2]: worker id;
-- ARGV[3]: TTL in milliseconds; ARGV[4]: most runs to claim
-- Returns: flat {encoded id, fence, expiry, encoded id, fence, expiry, ...}, longest claimable
-- first
-- The run hashes are read by name under the namespace's hash tag, so they live in KEYS[1]'s
-- slot even though they cannot be declared up front.
local now = now_micros()
local expires = now + tonumber(ARGV[3]) * 1000
local max = tonumber(ARGV[4])
local out = {}
local taken = 0
while taken < max do
  local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', num(now), 'LIMIT', 0, max - taken)
  if #members == 0 then
    break
  end
  for _, m in ipairs(members) do
    local id = string.sub(m, 17)
    local key = ARGV[1] .. id
    local r = read_run(key)
    if r and r.m == m and claimable(r, now) then
      local fence = take(key, KEYS[1], r, ARGV[2], expires)
      out[#out + 1] = id
      out[#out + 1] = fence
      out[#out + 1] = num(expires)
      taken = taken + 1
    elseif r and r.m == m and r.s == 'runnable' and r.f ~= FENCE_MAX and r.o ~= '' then
      -- Held and not expired: the index lagged; move it to the expiry.
      redis.call('ZADD', KEYS[1], r.e, m)
    else
      -- Gone, ended or exhausted: never claimable from the index.
      redis.call('ZREM', KEYS[1], m)
    end
  end
end
return out
