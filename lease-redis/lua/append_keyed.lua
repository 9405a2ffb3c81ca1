-- KEYS[1]: runs hash; KEYS[2]: the run's journal (list); KEYS[3]: the run's idempotency keys
-- (hash: key -> position of its entry in the journal, from 1)
-- ARGV[1]: encoded run id; ARGV[2]: presented fence; ARGV[3]: journal payload (binary-safe);
-- ARGV[4]: idempotency key
-- Returns: {'none'}; {'verdict', fence, state, owned ('1' or '0')}; or
-- {'ok', seq, entry} where entry is '<fence>:<written_at>:<payload>': the entry written with
-- this key, now or by an earlier call (then nothing is written).
-- The fence first: a key never lets a fence that moved on through. Then the key, whatever the
-- lease's state (a retry after the lease ended learns its first result). Then the lease.
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then
  return { 'none' }
end
local s, f, h, m, o = string.match(v, '^(%l+):(%d+):(%d+):%d*:(%x+):([^\1]*)')
if not s then
  return redis.error_reply('malformed run record for ' .. ARGV[1])
end
if f ~= ARGV[2] then
  return { 'verdict', f, s, o == '' and '0' or '1' }
end
local seq = redis.call('HGET', KEYS[3], ARGV[4])
if seq then
  return { 'ok', seq, redis.call('LINDEX', KEYS[2], tonumber(seq) - 1) }
end
if s ~= 'runnable' or o == '' then
  return { 'verdict', f, s, o == '' and '0' or '1' }
end
local t = redis.call('TIME')
local entry = f .. ':' .. t[1] .. string.format('%06d', t[2]) .. ':' .. ARGV[3]
seq = redis.call('RPUSH', KEYS[2], entry)
redis.call('HSET', KEYS[3], ARGV[4], seq)
return { 'ok', tostring(seq), entry }
