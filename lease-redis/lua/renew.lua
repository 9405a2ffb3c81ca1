-- KEYS[1]: runs hash; KEYS[i+1]: the claimable index (zset) of lease i's kind
-- ARGV[3i-2]: encoded run id of lease i; ARGV[3i-1]: its presented fence; ARGV[3i]: its TTL
-- in milliseconds
-- Returns: one array per lease, in order: {'ok', expiry}; {'none'}; or
-- {'verdict', fence, state, owned ('1' or '0')}
-- The run's entry in the claimable index moves to the new expiry (ZADD XX: a run at the last
-- fence has no entry and gets none), so the index never lags behind a renewal and claim_next
-- never walks held leases to find a claimable run. (A lease that names another kind than its
-- run's moves no entry: its run's entry lags, and claim_next moves it when it comes due.)
-- A hot script, run without the common.lua prelude (whose helpers every call would build
-- again): the record's format comes from record.lua, as common.lua's does.
local now
local out = {}
for i = 1, #ARGV, 3 do
  local id = ARGV[i]
  local v = redis.call('HGET', KEYS[1], id)
  if not v then
    out[#out + 1] = { 'none' }
  else
    local s, f, h, _, m, o, times = string.match(v, RECORD)
    if not s then
      return redis.error_reply('malformed run record for ' .. id)
    end
    if f ~= ARGV[i + 1] or s ~= 'runnable' or o == '' then
      out[#out + 1] = { 'verdict', f, s, o == '' and '0' or '1' }
    else
      if not now then
        local t = redis.call('TIME')
        now = t[1] * 1000000 + t[2] -- exact in a double until year 2255
      end
      local e = string.format('%d', now + ARGV[i + 2] * 1000)
      h = decimal_succ(h) -- heartbeats plus one, exactly
      -- Renewed now; the creation and claim times stay, and the facts.
      local created, claimed, facts = string.match(times, '^\1(%d*),(%d*),%d*(.*)$')
      redis.call('HSET', KEYS[1], id, 'runnable:' .. f .. ':' .. h .. ':' .. e .. ':' .. m .. ':' .. o
        .. '\1' .. (created or '') .. ',' .. (claimed or '') .. ',' .. string.format('%d', now) .. (facts or ''))
      redis.call('ZADD', KEYS[(i + 2) / 3 + 1], 'XX', e, m)
      out[#out + 1] = { 'ok', e }
    end
  end
end
return out
