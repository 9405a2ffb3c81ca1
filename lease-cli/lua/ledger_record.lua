-- Body of a fenced script: runs only after the adapter checked the lease's fence.
-- KEYS[1]: the run's ledger list (in the run's hash slot)
-- ARGV[1]: effect, ARGV[2]: fence, ARGV[3]: worker id
-- Returns: the ledger's new length
return redis.call('RPUSH', KEYS[1], cjson.encode({ effect = ARGV[1], fence = tonumber(ARGV[2]), worker = ARGV[3] }))
