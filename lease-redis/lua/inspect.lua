-- KEYS[1]: runs hash; KEYS[2]: failures hash; KEYS[3]: attempts hash; KEYS[4]: payloads hash;
-- KEYS[5]: kinds hash; KEYS[6]: ended runs (zset); KEYS[7]: history hash; KEYS[8]: the wait
-- hash; KEYS[9]: the resumed hash
-- ARGV[1]: encoded run id
-- Returns: {'none'} or {'ok', state, owner, expiry, fence, heartbeats, failure, attempts,
-- kind, times, wait, now, payload (as payload_of gives it), history (as push_attempt writes
-- it; a nil reply for none), resumed (the run's field in the resumed hash, record.lua's; a nil
-- reply for none), trace parent (as trace_of gives it: its text, or a nil reply for none)}
local r = read_run(KEYS[1], ARGV[1])
if not r then
  return { 'none' }
end
local out = record_reply('ok', record(r, KEYS[2], KEYS[3], KEYS[5], KEYS[6], KEYS[8]), now_micros())
out[#out + 1] = payload_of(KEYS[4], ARGV[1], r.t)
out[#out + 1] = redis.call('HGET', KEYS[7], ARGV[1])
out[#out + 1] = waited(r.t) and redis.call('HGET', KEYS[9], ARGV[1])
out[#out + 1] = trace_of(KEYS[4], ARGV[1], r.t)
return out
