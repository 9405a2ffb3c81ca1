-- KEYS[1]: the restore marker
-- ARGV[1]: none
-- Returns: {marker}: its text, or nil when it is not set.
return { redis.call('GET', KEYS[1]) }
