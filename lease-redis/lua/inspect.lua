-- KEYS[1]: runs hash; KEYS[2]: failures hash; KEYS[3]: attempts hash; KEYS[4]: payloads hash
-- ARGV[1]: encoded run id
-- Returns: {'none'} or {'ok', state, owner, expiry, fence, heartbeats, failure, attempts, now,
-- payload (as payload_of gives it)}
local r = read_run(KEYS[1], ARGV[1])
if not r then
  return { 'none' }
end
local rec = record(r, KEYS[2], KEYS[3])
return { 'ok', rec[1], rec[2], rec[3], rec[4], rec[5], rec[6], rec[7], num(now_micros()),
  payload_of(KEYS[4], ARGV[1]) }
