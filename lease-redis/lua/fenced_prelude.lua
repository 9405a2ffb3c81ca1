-- KEYS[1]: runs hash; KEYS[2..]: the caller's keys (all under the namespace's hash tag)
-- ARGV[1]: encoded run id; ARGV[2]: presented fence; ARGV[3..]: the caller's arguments
-- Returns: {'none'}; {'verdict', fence, state, owned ('1' or '0')}; or {'ok', result} where
-- result is what the caller's snippet returned (the caller's snippet follows this prelude,
-- wrapped in a function that sees its own KEYS and ARGV, without the adapter's)
local lease_run = read_run(KEYS[1], ARGV[1])
if not lease_run then
  return { 'none' }
end
if not held(lease_run, ARGV[2]) then
  return { 'verdict', lease_run.f, lease_run.s, owned_flag(lease_run) }
end
local lease_result = (function(KEYS, ARGV)
