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
-- again): it reads and writes the record format common.lua describes; keep them in step.
local now
local out = {}
for i = 1, #ARGV, 3 do
  local id = ARGV[i]
  local v = redis.call('HGET', KEYS[1], id)
  if not v then
    out[#out + 1] = { 'none' }
  else
    local s, f, h, m, o, times = string.match(v, '^(%l+):(%d+):(%d+):%d*:(%x+):([^\1]*)(.*)$')
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
      -- Heartbeats plus one, exactly: as a number while that is exact, else digit by digit.
      if #h < 16 then
        h = string.format('%d', h + 1)
      else
        local j = #h
        while j > 0 and string.byte(h, j) == 57 do
          j = j - 1
        end
        if j == 0 then
          h = '1' .. string.rep('0', #h)
        else
          h = string.sub(h, 1, j - 1) .. string.char(string.byte(h, j) + 1) .. string.rep('0', #h - j)
        end
      end
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
