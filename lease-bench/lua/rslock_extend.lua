-- rslock's extend: the lock's TTL is reset only by the holder of its value.
-- KEYS[1]: the lock key
-- ARGV[1]: the holder's value, ARGV[2]: TTL in milliseconds
-- Returns: 1 if extended, 0 if the lock is not ours
if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('pexpire',KEYS[1],ARGV[2]) else return 0 end
