-- KEYS[1]: runs hash; KEYS[2]: failures hash; KEYS[3]: attempts hash
-- ARGV[1]: encoded run id
-- Returns: {'none'} or {'ok', state, owner, expiry, fence, heartbeats, failure, attempts, now}
local r = read_run(KEYS[1], ARGV[1])
if not r then
  return { 'none' }
end
local rec = record(r, KEYS[2], KEYS[3])
return { 'ok', rec[1], rec[2], rec[3], rec[4], rec[5], rec[6], rec[7], num(now_micros()) }
