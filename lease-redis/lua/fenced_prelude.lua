-- KEYS[1]: run hash; KEYS[2..]: the caller's keys (all under the run's hash tag)
-- ARGV[1]: presented fence; ARGV[2..]: the caller's arguments
-- Returns: {'none'}; {'verdict', fence, state, owned ('1' or '0')}; or {'ok', result} where
-- result is what the caller's snippet returned (the caller's snippet follows this prelude,
-- wrapped in a function that sees its own KEYS and ARGV, without the run hash and fence)
local lease_run = read_run(KEYS[1])
if not lease_run then
  return { 'none' }
end
if not held(lease_run, ARGV[1]) then
  return { 'verdict', lease_run.f, lease_run.s, owned_flag(lease_run) }
end
local lease_result = (function(KEYS, ARGV)
