-- KEYS[1]: runs hash; KEYS[2]: the run's journal (list); KEYS[3]: claimable index (zset)
-- ARGV[1]: operation: 'append', 'release', 'suspend' or 'complete'; ARGV[2]: encoded run id;
-- ARGV[3]: presented fence; ARGV[4]: journal payload (append only; binary-safe)
-- Returns: {'none'}; {'verdict', fence, state, owned ('1' or '0')}; {'ok', seq, now} for
-- append; {'ok'} otherwise
-- Journal entries are stored as '<fence>:<written_at>:<payload>'; seq is the list position.
-- A hot script, run without the common.lua prelude (whose helpers every call would build
-- again): it reads and writes the record format common.lua describes; keep them in step.
local op = ARGV[1]
if op ~= 'append' and op ~= 'release' and op ~= 'suspend' and op ~= 'complete' then
  return redis.error_reply('unknown fenced operation ' .. op)
end
local v = redis.call('HGET', KEYS[1], ARGV[2])
if not v then
  return { 'none' }
end
local s, f, h, m, o = string.match(v, '^(%l+):(%d+):(%d+):%d*:(%x+):(.*)$')
if not s then
  return redis.error_reply('malformed run record for ' .. ARGV[2])
end
if f ~= ARGV[3] or s ~= 'runnable' or o == '' then
  return { 'verdict', f, s, o == '' and '0' or '1' }
end
if op == 'append' then
  local t = redis.call('TIME')
  local now = t[1] .. string.format('%06d', t[2])
  local seq = redis.call('RPUSH', KEYS[2], f .. ':' .. now .. ':' .. ARGV[4])
  return { 'ok', tostring(seq), now }
end
if op == 'release' then
  if f == '9223372036854775807' then
    redis.call('ZREM', KEYS[3], m) -- never claimable again
  else
    -- Claimable from now: behind the runs that waited longer.
    local t = redis.call('TIME')
    redis.call('ZADD', KEYS[3], t[1] .. string.format('%06d', t[2]), m)
  end
else
  s = op == 'suspend' and 'suspended' or 'completed'
  redis.call('ZREM', KEYS[3], m)
end
-- Owner and expiry cleared.
redis.call('HSET', KEYS[1], ARGV[2], s .. ':' .. f .. ':' .. h .. '::' .. m .. ':')
return { 'ok' }
