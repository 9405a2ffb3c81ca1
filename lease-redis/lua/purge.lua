-- KEYS[1]: runs hash; KEYS[2]: ended runs (zset); KEYS[3]: all run ids (zset); KEYS[4]:
-- tombstones (hash: purged id -> its last fence); KEYS[5]: failures hash; KEYS[6]: claimable
-- index (zset); KEYS[7]: attempts hash; KEYS[8]: cancelled runs (set); KEYS[9]: payloads
-- hash; KEYS[10]: kinds hash; KEYS[11]: history hash; KEYS[3i+9], KEYS[3i+10], KEYS[3i+11]:
-- run i's journal, applied appends and idempotency keys
-- ARGV[1]: age in ms; ARGV[i+1]: encoded id of run i
-- Returns: the encoded ids removed. Each run is checked again here (still completed, failed or
-- cancelled,
-- ended at least ARGV[1] ms ago): one resumed or re-created since purge_due.lua listed it is
-- left alone. A removed run leaves its last fence in the tombstones, where create starts a run
-- of that id again, so no fence of the id is ever issued twice. Its keys are UNLINKed: a long
-- journal is freed in the background, not inside this script.
local cutoff = now_micros() - tonumber(ARGV[1]) * 1000
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local at = redis.call('ZSCORE', KEYS[2], id)
  local r = read_run(KEYS[1], id)
  if not r then
    redis.call('ZREM', KEYS[2], id) -- nothing left to purge
  elseif at and tonumber(at) <= cutoff and (r.s == 'completed' or r.s == 'failed' or r.s == 'cancelled') then
    local base = 3 * (i - 1) + 6
    local buried = redis.call('HGET', KEYS[4], id)
    if not buried or #buried < #r.f or (#buried == #r.f and buried < r.f) then
      redis.call('HSET', KEYS[4], id, r.f)
    end
    redis.call('HDEL', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[7], id)
    redis.call('SREM', KEYS[8], id)
    redis.call('HDEL', KEYS[9], id)
    redis.call('HDEL', KEYS[10], id)
    redis.call('HDEL', KEYS[11], id)
    redis.call('ZREM', KEYS[6], r.m)
    redis.call('UNLINK', KEYS[base + 3], KEYS[base + 4], KEYS[base + 5])
    out[#out + 1] = id
  end
end
return out
