-- KEYS[1]: all runs (zset, score 0, member = encoded id, so lexicographic = run id order)
-- ARGV[1]: run hash key prefix (same hash tag as KEYS[1]); ARGV[2]: encoded id to start after,
-- or ''; ARGV[3]: limit; ARGV[4]: state to keep, or ''; ARGV[5]: '1' to keep only expired
-- leases
-- Returns: flat {now, id, state, owner, expiry, fence, heartbeats, id, ...} ordered by id
local now = now_micros()
local min = '-'
if ARGV[2] ~= '' then
  min = '(' .. ARGV[2]
end
local limit = tonumber(ARGV[3])
local out = { num(now) }
local n = 0
local offset = 0
while n < limit do
  local ids = redis.call('ZRANGEBYLEX', KEYS[1], min, '+', 'LIMIT', offset, 256)
  if #ids == 0 then
    break
  end
  offset = offset + #ids
  for _, id in ipairs(ids) do
    local r = read_run(ARGV[1] .. id)
    if r
      and (ARGV[4] == '' or r.s == ARGV[4])
      and (ARGV[5] ~= '1' or (r.o ~= '' and r.e ~= '' and tonumber(r.e) <= now)) then
      out[#out + 1] = id
      out[#out + 1] = r.s
      out[#out + 1] = r.o
      out[#out + 1] = r.e
      out[#out + 1] = r.f
      out[#out + 1] = r.h
      n = n + 1
      if n >= limit then
        break
      end
    end
  end
end
return out
