-- KEYS[1]: runs hash; KEYS[2]: the run's journal (list)
-- ARGV[1]: encoded run id; ARGV[2]: index of the first entry to return (0-based); ARGV[3]:
-- stop after the entry that brings the returned payload bytes to this many
-- Returns: {'none'} or {'ok', next, entry, entry, ...}, each entry
-- '<fence>:<written_at>:<payload>', where next is the index to continue from, or '' when the
-- journal's end was reached. One call returns at least one entry (if any remain) and stops
-- once its entries reach the byte budget, so no call copies a whole long journal.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return { 'none' }
end
local CHUNK = 64
local at = tonumber(ARGV[2])
local budget = tonumber(ARGV[3])
local out = { 'ok', '' }
local bytes = 0
while true do
  local chunk = redis.call('LRANGE', KEYS[2], at, at + CHUNK - 1)
  for _, entry in ipairs(chunk) do
    out[#out + 1] = entry
    at = at + 1
    bytes = bytes + #entry
    if bytes >= budget then
      if redis.call('LLEN', KEYS[2]) > at then
        out[2] = tostring(at)
      end
      return out
    end
  end
  if #chunk < CHUNK then
    return out
  end
end
