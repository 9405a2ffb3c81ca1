-- KEYS[1]: the restore marker; KEYS[2]: the epoch
-- ARGV[1]: how far to raise the epoch (2^40, decimal)
-- Returns: {epoch}: the epoch after (decimal).
-- The last step of a rebind: claims are served again, and the epoch jumps past any value a
-- store of the history before the restore could have seen, so that such a store, still
-- running, takes the next epoch it reads for progress, not for a restore.
redis.call('DEL', KEYS[1])
return { tostring(redis.call('INCRBY', KEYS[2], ARGV[1])) }
