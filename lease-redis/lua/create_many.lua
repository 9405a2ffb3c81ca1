-- KEYS[1]: runs hash; KEYS[2]: unused (the default kind's claimable index); KEYS[3]: all run ids (zset, score 0,
-- by encoded id); KEYS[4]: creation counter; KEYS[5]: the fence floor (string: the highest
-- fence of any purged run, where every run starts); KEYS[6]: attempts hash; KEYS[7]: delayed
-- runs (zset: encoded id scored by its delay's end; for count); KEYS[8]: payloads hash;
-- KEYS[9]: kinds hash (id -> kind, for kinds other than the default); KEYS[10]: every kind but
-- the default (set, for count); KEYS[11]: unique keys (hash: key -> the run that took it last);
-- KEYS[12]: each keyed run's key (hash); KEYS[12+i]: the claimable index of run i's kind
-- ARGV[7i-6]: encoded id of run i; ARGV[7i-5]: its start delay in ms (0: claimable at once);
-- ARGV[7i-4]: its payload, '' for none or '=' followed by its bytes; ARGV[7i-3]: its run_at in
-- µs since the Unix epoch ('' for none; the later of it and the delay's end holds); ARGV[7i-2]:
-- its kind, '' for the default; ARGV[7i-1]: its unique key, '' for none; ARGV[7i]: its trace
-- parent, '' for none (kept in the payloads hash, field 't:' and the id; flagged 't')
-- Returns: one string per run, in order: '1' if created, '0' if it existed (also for the
-- second copy of an id repeated in the batch), '=' and an encoded id if that live run holds
-- its unique key (also a run created earlier in the batch)
-- The new runs take consecutive creation orders in input order and one claimable instant
-- (plus each one's delay), so claim_next hands out the undelayed ones in input order. A
-- delayed run is unowned with its expiry at the delay's end, as after a retry delay.
local out = {}
local seen = {}
local new = {}
local delays = {}
local payloads = {}
local times = {}
local items = {}
local taken = {}
for i = 1, #ARGV / 7 do
  local id = ARGV[7 * i - 6]
  local key = ARGV[7 * i - 1]
  local holder = nil
  if key ~= '' then
    holder = taken[key] or unique_holder(KEYS[1], KEYS[11], key)
  end
  if seen[id] or redis.call('HEXISTS', KEYS[1], id) == 1 then
    out[i] = '0'
  elseif holder then
    out[i] = '=' .. holder
  else
    seen[id] = true
    if key ~= '' then
      taken[key] = id
    end
    new[#new + 1] = id
    delays[#new] = tonumber(ARGV[7 * i - 5])
    payloads[#new] = ARGV[7 * i - 4]
    times[#new] = ARGV[7 * i - 3]
    items[#new] = i
    out[i] = '1'
  end
end
if #new == 0 then
  return out
end
local now = now_micros()
local floor = redis.call('GET', KEYS[5]) or '0' -- every run starts at the fence floor
local first = redis.call('INCRBY', KEYS[4], #new) - #new
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', num(now)) -- delays over: claimable
for n, id in ipairs(new) do
  local at, e = not_before(now, delays[n], times[n]), ''
  if at > now then
    e = num(at)
    redis.call('ZADD', KEYS[7], e, id)
  end
  -- Zero-padded creation order first: equal scores then sort by creation, oldest first.
  local member = string.format('%016x', first + n) .. id
  local fence = floor
  -- The record's expiry field: the instant it is claimable from (common.lua's record format).
  write_run(KEYS[1], { id = id, s = 'runnable', f = fence, h = '0', e = num(at), m = member, o = '',
    t = times_suffix(num(now), '', '', creation_facts(ARGV[7 * items[n] - 2], payloads[n],
      ARGV[7 * items[n]])) })
  index(KEYS[12 + items[n]], { f = fence, m = member }, at)
  wake(KEYS[12 + items[n]], at, now)
  redis.call('ZADD', KEYS[3], 0, id)
  store_payload(KEYS[8], id, payloads[n])
  store_trace(KEYS[8], id, ARGV[7 * items[n]])
  local key = ARGV[7 * items[n] - 1]
  if key ~= '' then
    redis.call('HSET', KEYS[11], key, id)
    redis.call('HSET', KEYS[12], id, key)
  end
  local kind = ARGV[7 * items[n] - 2]
  if kind ~= '' then
    redis.call('HSET', KEYS[9], id, kind)
    redis.call('SADD', KEYS[10], kind)
  end
  redis.call('HDEL', KEYS[6], id) -- a fresh budget
end
return out
