-- KEYS[1]: runs hash
-- ARGV[3i-2]: encoded run id of lease i; ARGV[3i-1]: its presented fence; ARGV[3i]: its TTL
-- in milliseconds
-- Returns: one array per lease, in order: {'ok', expiry}; {'none'}; or
-- {'verdict', fence, state, owned ('1' or '0')}
-- The claimable index is not touched: claim_next corrects a lagging entry when it meets it.
local now = now_micros()
local out = {}
for i = 1, #ARGV, 3 do
  local r = read_run(KEYS[1], ARGV[i])
  if not r then
    out[#out + 1] = { 'none' }
  elseif not held(r, ARGV[i + 1]) then
    out[#out + 1] = { 'verdict', r.f, r.s, owned_flag(r) }
  else
    local expires = now + tonumber(ARGV[i + 2]) * 1000
    r.e = num(expires)
    r.h = succ(r.h)
    write_run(KEYS[1], r)
    out[#out + 1] = { 'ok', r.e }
  end
end
return out
