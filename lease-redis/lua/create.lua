-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset); KEYS[3]: all run ids (zset, score 0,
-- by encoded id); KEYS[4]: creation counter; KEYS[5]: the fence floor (string: the highest
-- fence of any purged run); KEYS[6]: attempts hash; KEYS[7]: delayed runs (zset: encoded id scored by its
-- delay's end; for count); KEYS[8]: payloads hash; KEYS[9]: kinds hash (id -> kind, for
-- kinds other than the default); KEYS[10]: every kind but the default (set, for count);
-- KEYS[11]: unique keys (hash: key -> the run that took it last); KEYS[12]: each keyed run's
-- key (hash). KEYS[2] is the index of the run's kind.
-- ARGV[1]: encoded run id; ARGV[2]: start delay in ms (0: claimable at once); ARGV[3]: the
-- payload, '' for none or '=' followed by its bytes; ARGV[4]: run_at, µs since the Unix epoch
-- ('' for none): claimable from the later of it and the delay's end, on this server's clock;
-- ARGV[5]: the run's class ('' for the default kind at priority 0), kept in the kinds hash
-- and, with the run's other facts, in its record; ARGV[6]: its unique key ('' for none);
-- ARGV[7]: its trace parent ('' for none), kept in the payloads hash (field 't:' and the id)
-- and flagged 't' in its record
-- Returns: {'exists'} if the run exists; {'held', id} if the live run id holds the unique key;
-- else {'ok', now, fence, not_before} (fence: the
-- floor, above every fence a purged run carried, so an id purged and created again never
-- reuses one; not_before: the delay's end on this
-- server's clock in µs, or '' without a delay). A delayed run is unowned with its expiry at
-- the delay's end, as after a retry delay: claim and claim_next wait for it.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return { 'exists' }
end
if ARGV[6] ~= '' then
  local holder = unique_holder(KEYS[1], KEYS[11], ARGV[6])
  if holder then
    return { 'held', holder }
  end
  redis.call('HSET', KEYS[11], ARGV[6], ARGV[1])
  redis.call('HSET', KEYS[12], ARGV[1], ARGV[6])
end
local now = now_micros()
local order = redis.call('INCR', KEYS[4])
-- Zero-padded creation order first: equal scores then sort by creation, oldest first.
local member = string.format('%016x', order) .. ARGV[1]
local fence = redis.call('GET', KEYS[5]) or '0'
local at, e = not_before(now, tonumber(ARGV[2]), ARGV[4]), ''
if at > now then
  e = num(at)
  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', num(now)) -- delays over: claimable
  redis.call('ZADD', KEYS[7], e, ARGV[1])
end
-- The record's expiry field: the instant it is claimable from (common.lua's record format).
write_run(KEYS[1], { id = ARGV[1], s = 'runnable', f = fence, h = '0', e = num(at), m = member, o = '',
  t = times_suffix(num(now), '', '', creation_facts(ARGV[5], ARGV[3], ARGV[7])) })
index(KEYS[2], { f = fence, m = member }, at)
wake(KEYS[2], at, now)
redis.call('ZADD', KEYS[3], 0, ARGV[1])
store_payload(KEYS[8], ARGV[1], ARGV[3])
store_trace(KEYS[8], ARGV[1], ARGV[7])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[9], ARGV[1], ARGV[5])
  redis.call('SADD', KEYS[10], ARGV[5])
end
redis.call('HDEL', KEYS[6], ARGV[1]) -- a fresh budget, also for a purged id created again
return { 'ok', num(now), fence, e }
