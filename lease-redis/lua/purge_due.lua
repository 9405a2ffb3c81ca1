-- KEYS[1]: ended runs (zset: encoded id scored by when it ended, in µs); KEYS[2]: runs hash
-- ARGV[1]: age in ms; ARGV[2]: most ids; ARGV[3]: the ended states wanted (a mask: completed 1,
-- failed 2, cancelled 4); ARGV[4], ARGV[5]: where to look from, the score and the member of the
-- last entry an earlier call of the same mask passed over ('-inf' and '' at first); ARGV[6]:
-- the most entries one call looks at
-- Returns: where the next call of this mask may look from (a score and a member), '1' if this
-- call stopped at its bound on entries looked at (more may be due) or '0', then the encoded
-- ids of up to ARGV[2] runs in a wanted state that ended at least ARGV[1] ms ago, oldest end
-- first (candidates: purge.lua checks each again with its keys declared).
--
-- With every state wanted, the oldest entries are the candidates. With some, entries of the
-- other states are passed over, and the reply says where the entries passed over before the
-- first candidate end, so that a caller asking again for the same states starts after them
-- (an entry keeps its state as long as it keeps its score: a run that ends again is scored
-- again, later). Entries of one score are ordered by member, so the place is exact even when
-- entries before it were removed since.
local cutoff = num(now_micros() - tonumber(ARGV[1]) * 1000)
local max = tonumber(ARGV[2])
local mask = tonumber(ARGV[3])
if mask == 7 then
  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, max)
  table.insert(ids, 1, '0')
  table.insert(ids, 1, '')
  table.insert(ids, 1, '-inf')
  return ids
end
local bits = { completed = 1, failed = 2, cancelled = 4 }
local from, after = ARGV[4], ARGV[5]
local budget = tonumber(ARGV[6])
local out = { from, after, '0' }
local offset = 0
local found = false
while #out - 3 < max do
  if budget <= 0 then
    out[3] = '1'
    break
  end
  local page = redis.call('ZRANGEBYSCORE', KEYS[1], from, cutoff, 'WITHSCORES', 'LIMIT', offset, 256)
  if #page == 0 then
    break
  end
  for i = 1, #page, 2 do
    local id, score = page[i], page[i + 1]
    -- Entries of the start score up to the last one passed over were looked at before.
    if not (after ~= '' and score == from and id <= after) then
      budget = budget - 1
      local r = read_run(KEYS[2], id)
      local bit = r and bits[r.s]
      if bit and (mask % (2 * bit)) >= bit then
        found = true
        if #out - 3 < max then
          out[#out + 1] = id
        end
      elseif not found then
        out[1], out[2] = score, id -- passed over: the next call may start after it
      end
    end
  end
  offset = offset + #page / 2
end
return out
