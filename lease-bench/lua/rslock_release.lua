-- rslock's unlock: the lock is deleted only by the holder of its value.
-- KEYS[1]: the lock key
-- ARGV[1]: the holder's value
-- Returns: 1 if deleted, 0 if the lock is not ours
if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end
