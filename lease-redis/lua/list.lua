-- KEYS[1]: all run ids (zset, score 0, member = encoded id, so lexicographic = run id order);
-- KEYS[2]: runs hash; KEYS[3]: failures hash; KEYS[4]: attempts hash; KEYS[5]: kinds hash;
-- KEYS[6]: ended runs (zset); KEYS[7]: the wait hash
-- ARGV[1]: encoded id to start after, or ''; ARGV[2]: most records to return; ARGV[3]: state
-- to keep, or ''; ARGV[4]: '1' to keep only expired leases; ARGV[5]: most ids to examine;
-- ARGV[6]: '' to keep every kind, else '=' followed by the kind to keep ('=' alone: the default);
-- a run's kind is its class (kinds hash) up to a newline or a vertical tab (a priority or a
-- queue follows it); ARGV[7]: '' to keep every queue, else '=' followed by the queue to keep
-- (a class without a vertical tab is the default queue's, '=default')
-- Returns: flat {now, cursor, id, state, owner, expiry, fence, heartbeats, failure, attempts,
-- kind, times, wait, id, ...} ordered by
-- id, where cursor is the last id examined (continue after it) or '' when the end was reached.
-- The work of one call is bounded by ARGV[5], whatever the filter keeps, so a long filtered
-- listing never blocks the server for long; the caller pages with the cursor.
local now = now_micros()
local min = '-'
if ARGV[1] ~= '' then
  min = '(' .. ARGV[1]
end
local limit = tonumber(ARGV[2])
local budget = tonumber(ARGV[5])
local ids = redis.call('ZRANGEBYLEX', KEYS[1], min, '+', 'LIMIT', 0, budget)
local out = { num(now), '' }
local n = 0
-- Whether the run's class (looked up once, and only when a filter needs it) passes the kind and
-- queue filters.
local function class_kept(id, r)
  if ARGV[6] == '' and ARGV[7] == '' then
    return true
  end
  local class = kind_of(KEYS[5], id, r.t)
  return (ARGV[6] == '' or '=' .. string.match(class, '^[^\n\v]*') == ARGV[6])
    and (ARGV[7] == '' or '=' .. (string.match(class, '\v(.*)$') or 'default') == ARGV[7])
end
for i, id in ipairs(ids) do
  local r = read_run(KEYS[2], id)
  if r
    and (ARGV[3] == '' or r.s == ARGV[3])
    and (ARGV[4] ~= '1' or (r.o ~= '' and r.e ~= '' and tonumber(r.e) <= now))
    and class_kept(id, r) then
    out[#out + 1] = id
    for _, field in ipairs(record(r, KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])) do
      out[#out + 1] = field
    end
    n = n + 1
  end
  if n >= limit or i == #ids and #ids == budget then
    out[2] = id
    if n >= limit then
      break
    end
  end
end
return out
