-- KEYS[1]: runs hash
-- ARGV[1]: encoded run id
-- Returns: {'none'} or {'ok', state, owner, expiry, fence, heartbeats, now}
local r = read_run(KEYS[1], ARGV[1])
if not r then
  return { 'none' }
end
local rec = record(r)
return { 'ok', rec[1], rec[2], rec[3], rec[4], rec[5], num(now_micros()) }
