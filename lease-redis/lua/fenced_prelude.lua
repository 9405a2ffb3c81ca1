-- KEYS[1]: runs hash; KEYS[2]: the run's applied calls (hash, as fenced.lua keeps them);
-- KEYS[3..]: the caller's keys (all under the namespace's hash tag)
-- ARGV[1]: encoded run id; ARGV[2]: presented fence; ARGV[3]: this call's id; ARGV[4..]: the
-- caller's arguments
-- Returns: {'none'}; {'verdict', fence, state, owned ('1' or '0')}; or {'ok', result} where
-- result is what the caller's snippet returned (the caller's snippet follows this prelude,
-- wrapped in a function that sees its own KEYS and ARGV, without the adapter's). A call whose
-- id is recorded under the presented fence ran already (a resend): it answers the snippet's
-- first result, kept with cmsgpack, and runs nothing.
local lease_run = read_run(KEYS[1], ARGV[1])
if not lease_run then
  return { 'none' }
end
if lease_run.f ~= ARGV[2] then
  return { 'verdict', lease_run.f, lease_run.s, owned_flag(lease_run) }
end
local lease_calls = redis.call('HMGET', KEYS[2], 'f', ARGV[3])
if lease_calls[1] == lease_run.f and lease_calls[2] then
  return { 'ok', cmsgpack.unpack(lease_calls[2]) }
end
if not held(lease_run, ARGV[2]) then
  return { 'verdict', lease_run.f, lease_run.s, owned_flag(lease_run) }
end
local function lease_record(result)
  if lease_calls[1] ~= lease_run.f then
    redis.call('DEL', KEYS[2]) -- the calls of an earlier fence
  end
  redis.call('HSET', KEYS[2], 'f', lease_run.f, ARGV[3], cmsgpack.pack(result))
  return result
end
local lease_result = (function(KEYS, ARGV)
