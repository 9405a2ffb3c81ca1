-- KEYS[1]: runs hash; KEYS[2]: ended runs (zset); KEYS[3]: all run ids (zset); KEYS[4]: the
-- fence floor (string: the highest fence of any purged run); KEYS[5]: failures hash; KEYS[6]:
-- claimable index (zset); KEYS[7]: attempts hash; KEYS[8]: cancelled runs (set); KEYS[9]: payloads
-- hash (the run's payload, field id, and trace parent, field 't:' and the id); KEYS[10]: kinds hash; KEYS[11]: history hash; KEYS[12]: unique keys (hash: key -> the
-- run that took it last); KEYS[13]: each keyed run's key (hash); KEYS[14]: the wait hash;
-- KEYS[15]: the deadlines zset; KEYS[16]: the resumed hash; KEYS[3i+14], KEYS[3i+15],
-- KEYS[3i+16]: run i's journal, applied appends and idempotency keys
-- ARGV[1]: age in ms; ARGV[i+1]: encoded id of run i
-- Returns: the encoded ids removed. Each run is checked again here (still completed, failed or
-- cancelled, ended at least ARGV[1] ms ago): one resumed or re-created since purge_due.lua listed it is
-- left alone. A removed run raises the fence floor to its fence, where create starts every run,
-- so an id created again never reuses a fence; nothing else of it is kept. Its keys are
-- UNLINKed: a long journal is freed in the background, not inside this script.
local cutoff = now_micros() - tonumber(ARGV[1]) * 1000
local out = {}
local floor = redis.call('GET', KEYS[4]) or '0'
for i = 2, #ARGV do
  local id = ARGV[i]
  local at = redis.call('ZSCORE', KEYS[2], id)
  local r = read_run(KEYS[1], id)
  if not r then
    redis.call('ZREM', KEYS[2], id) -- nothing left to purge
  elseif at and tonumber(at) <= cutoff and (r.s == 'completed' or r.s == 'failed' or r.s == 'cancelled') then
    local base = 3 * (i - 1) + 11
    floor = fence_max(floor, r.f)
    redis.call('HDEL', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[7], id)
    redis.call('SREM', KEYS[8], id)
    redis.call('HDEL', KEYS[9], id, 't:' .. id)
    redis.call('HDEL', KEYS[10], id)
    redis.call('HDEL', KEYS[11], id)
    redis.call('HDEL', KEYS[14], id)
    redis.call('ZREM', KEYS[15], id)
    redis.call('HDEL', KEYS[16], id)
    redis.call('ZREM', KEYS[6], r.m)
    -- Its unique key, unless a later run took it.
    local key = redis.call('HGET', KEYS[13], id)
    if key then
      redis.call('HDEL', KEYS[13], id)
      if redis.call('HGET', KEYS[12], key) == id then
        redis.call('HDEL', KEYS[12], key)
      end
    end
    redis.call('UNLINK', KEYS[base + 3], KEYS[base + 4], KEYS[base + 5])
    out[#out + 1] = id
  end
end
if #out > 0 then
  redis.call('SET', KEYS[4], floor)
end
return out
