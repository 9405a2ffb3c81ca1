-- KEYS[1]: runs hash; KEYS[2]: failures hash; KEYS[3]: attempts hash
-- ARGV[i]: encoded run id i
-- Returns: {now, then for each run in order: {} if it does not exist, else {state, owner,
-- expiry, fence, heartbeats, failure, attempts}}
local out = { num(now_micros()) }
for i = 1, #ARGV do
  local r = read_run(KEYS[1], ARGV[i])
  if r then
    out[#out + 1] = record(r, KEYS[2], KEYS[3])
  else
    out[#out + 1] = {}
  end
end
return out
