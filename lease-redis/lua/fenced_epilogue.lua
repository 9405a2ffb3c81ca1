-- Follows the caller's snippet in a FencedScript (see fenced_prelude.lua for KEYS and ARGV).
-- A snippet that returned an error reply failed: its error is the answer, the lease is not
-- ended and the call is not recorded (a retry runs it again). Otherwise the lease ends as
-- asked and the call's result is recorded.
if type(lease_result) == 'table' and lease_result.err then
  return lease_result
end
return { 'ok', lease_record(lease_result) }
