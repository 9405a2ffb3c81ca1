-- KEYS[1]: runs hash; KEYS[2]: failures hash; KEYS[3]: attempts hash; KEYS[4]: payloads hash;
-- KEYS[5]: kinds hash; KEYS[6]: ended runs (zset); KEYS[7]: the wait hash; KEYS[8]: the
-- resumed hash
-- ARGV[i]: encoded run id i
-- Returns: {now, then for each run in order: {} if it does not exist, else {state, owner,
-- expiry, fence, heartbeats, failure, attempts, kind, times, wait, payload (as payload_of
-- gives it), resumed (as inspect.lua gives it), trace parent (as trace_of gives it)}}
local out = { num(now_micros()) }
for i = 1, #ARGV do
  local r = read_run(KEYS[1], ARGV[i])
  if r then
    local rec = record(r, KEYS[2], KEYS[3], KEYS[5], KEYS[6], KEYS[7])
    rec[#rec + 1] = payload_of(KEYS[4], ARGV[i], r.t)
    rec[#rec + 1] = waited(r.t) and redis.call('HGET', KEYS[8], ARGV[i])
    rec[#rec + 1] = trace_of(KEYS[4], ARGV[i], r.t)
    out[#out + 1] = rec
  else
    out[#out + 1] = {}
  end
end
return out
