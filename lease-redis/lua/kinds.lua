-- KEYS[1]: every kind but the default (set)
-- ARGV: none
-- Returns: the kinds' names, for count.lua, which checks that there are still as many.
return redis.call('SMEMBERS', KEYS[1])
