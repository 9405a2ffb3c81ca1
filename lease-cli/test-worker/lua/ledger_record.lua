-- Body of a fenced script: runs only after the adapter checked the lease's fence.
-- KEYS[1]: the run's ledger list (in the run's hash slot)
-- ARGV[1]: effect, ARGV[2]: fence (a decimal string), ARGV[3]: worker id
-- Returns: the ledger's new length
-- The fence goes into the JSON as its own digits: a Lua number (a double) would print
-- 100000000000001 as 1e+14 and round fences above 2^53.
if not string.match(ARGV[2], '^%d+$') then
  return redis.error_reply('ERR ledger fence must be a decimal integer')
end
local entry = '{"effect":' .. cjson.encode(ARGV[1]) .. ',"fence":' .. ARGV[2] ..
  ',"worker":' .. cjson.encode(ARGV[3]) .. '}'
return redis.call('RPUSH', KEYS[1], entry)
